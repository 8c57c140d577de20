"""The servers' listening socket: every accepted connection has Nagle's algorithm off.

With Nagle on, a response written in pieces (headers, then each SSE event) waits for the
client's delayed ACK (40 ms on Linux) before each piece: streamed tokens arrive late and
the router added ~47 ms a request. asyncio disables Nagle only on accepted sockets whose
protocol is IPPROTO_TCP, so the check runs the real asyncio server on our socket.
"""
from __future__ import annotations

import asyncio
import socket

import pytest

from engine.listen import listen_socket


def accepted_nodelay(listener: socket.socket) -> int:
    """TCP_NODELAY of the server side of one connection accepted by asyncio on `listener`."""
    async def main() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        host, port = listener.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        value = await asyncio.wait_for(seen, 10)
        writer.close()
        server.close()
        await server.wait_closed()
        return value

    return asyncio.run(main())


def test_connections_accepted_on_the_servers_socket_have_nagle_off():
    assert accepted_nodelay(listen_socket("127.0.0.1", 0)) != 0


def test_the_plain_socket_it_replaces_kept_nagle_on():
    # what both CLIs used to bind: protocol 0, so asyncio left Nagle on (the bug above)
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    plain.listen(8)
    assert accepted_nodelay(plain) == 0


def test_a_busy_port_names_the_flag_to_change():
    first = listen_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))  # not SO_REUSEADDR-compatible with a listening socket
    with pytest.raises(SystemExit, match="choose another --port"):
        listen_socket("127.0.0.1", port)
    first.close()
    busy.close()


def test_both_servers_bind_with_it():
    from engine.entrypoints import cli as engine_cli
    from paged_router import cli as router_cli

    assert router_cli.listen_socket is listen_socket
    sock = engine_cli.bind_socket("127.0.0.1", 0)
    assert accepted_nodelay(sock) != 0
