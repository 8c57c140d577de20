"""uvicorn, with the two things it lacks for a server on an open network.

- A header-read timeout. uvicorn's keep-alive timer starts only after a response, so a
  client that opens a connection and sends its headers slowly (or never) holds it for
  ever. `header_timeout_protocol(seconds)` is uvicorn's h11 protocol with a deadline
  armed when the server starts waiting for a request's headers (connection opened, or a
  keep-alive connection's next request begun) and cancelled once they are complete;
  trickling bytes does not extend it. At the deadline the connection is closed.
- A hook at the start of a graceful shutdown, so the app can end open streams cleanly
  (an error event and `data: [DONE]`) when the grace period runs out, before uvicorn
  would cancel them mid-chunk (`Server.on_shutdown`).

The connection limit is uvicorn's own `limit_concurrency` (503 beyond it).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class _HeaderTimeoutH11(H11Protocol):
    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm_header_timer()  # part of a request line or headers: keep the deadline
        else:
            self._cancel_header_timer()  # headers complete (or the connection is closing)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout,
                                                      self._header_timeout_expired)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout_expired(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closing a connection that sent no complete request headers "
                             "within %.0f s", self.header_timeout)
            self.transport.close()


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    return type("HeaderTimeoutH11", (_HeaderTimeoutH11,), {"header_timeout": seconds})


class Server(uvicorn.Server):
    """uvicorn.Server that calls `on_shutdown()` when a graceful shutdown begins."""

    def __init__(self, config: uvicorn.Config, *, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets=sockets)
