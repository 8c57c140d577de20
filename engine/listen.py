"""The listening socket of the engine's server and of the router (torch-free).

Both servers bind their own socket (so `--port 0` can print the port it got) and hand it
to uvicorn. asyncio turns Nagle's algorithm off (TCP_NODELAY) only on accepted sockets
whose protocol is IPPROTO_TCP, and a socket made as `socket(AF_INET, SOCK_STREAM)` has
protocol 0, so its connections kept Nagle on: a response written in pieces (headers, then
each SSE event) waited for the client's delayed ACK, up to 40 ms a piece on Linux (the
router added 47 ms a request through that). Here the protocol is IPPROTO_TCP and the
listener itself has TCP_NODELAY (accepted sockets inherit it on Linux), so every
connection sends each write at once.
"""
from __future__ import annotations

import socket


def listen_socket(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc}; choose another --port") from None
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock
