"""Forwarding one request: pick, send, retry once before streaming, stream through.

A backend that refuses the connection or answers 503 before the response starts is
ejected and the request goes once to the next candidate; after the first byte reaches
the client there is no retry. Response bytes pass through as they arrive (SSE is never
buffered); a client that goes away closes the upstream connection, which makes the engine
abort the request.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from engine.router.metrics import RouterMetrics
from engine.router.policies import Policy, RouteRequest
from engine.router.pool import Backend, BackendPool

logger = logging.getLogger("engine.router")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade", "host", "content-length"}
OWN_HEADERS = {"date", "server"}  # uvicorn adds the router's own
ATTEMPTS = 2  # the pick and one retry


def error(message: str, status: int, code: str, **headers: str) -> JSONResponse:
    kind = {400: "invalid_request_error", 401: "authentication_error",
            502: "server_error", 503: "service_unavailable_error"}.get(status, "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": code}}, status_code=status, headers=headers)


class RelayResponse(StreamingResponse):
    """Streams an upstream response through; whatever happens to the client (even a
    disconnect before the first byte), the upstream connection is closed and the
    backend's in-flight count released exactly once."""

    def __init__(self, upstream: httpx.Response, release: Callable[[], None], **kw: Any
                 ) -> None:
        super().__init__(upstream.aiter_raw(), **kw)
        self.upstream, self._release = upstream, release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):  # closing must finish even when cancelled
                await self.upstream.aclose()
            self._release()


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Forwarder:
    def __init__(self, pool: BackendPool, policy: Policy, hasher: Any,
                 metrics: RouterMetrics, *, connect_timeout: float = 2.0) -> None:
        self.pool, self.policy, self.hasher, self.metrics = pool, policy, hasher, metrics
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_timeout, read=None, write=60.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))

    async def aclose(self) -> None:
        await self.client.aclose()

    def route_request(self, body: dict[str, Any], headers: Any) -> RouteRequest:
        session = headers.get("x-session-id") or body.get("user")
        hashes = self.hasher.request_hashes(body) if self.policy.name == "prefix" else []
        return RouteRequest(hashes=hashes, session=str(session) if session else None)

    async def forward(self, request: Request, method: str, path: str, body: bytes,
                      route: RouteRequest) -> Response:
        start = time.perf_counter()
        backends = self.pool.available()
        if not backends:
            self.metrics.failures.labels(reason="no_backend").inc()
            return error("no healthy backend: every engine replica is down or ejected; "
                         "retry shortly", 503, "no_healthy_backend", **{"Retry-After": "1"})
        choice = self.policy.choose(route, backends)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url_tail = path + (f"?{request.url.query}" if request.url.query else "")
        last: Response | None = None
        for attempt, backend in enumerate(choice.order[:ATTEMPTS]):
            decision = choice.decision if attempt == 0 else "retry"
            routed = time.perf_counter()
            backend.in_flight += 1
            self._export(backend)
            upstream = self.client.build_request(method, backend.url + url_tail,
                                                 headers=headers, content=body)
            try:
                response = await self._send(request, upstream)
            except httpx.TransportError as exc:  # refused, reset or dropped before headers
                self._release(backend)
                reason = "connect_failed" if isinstance(exc, httpx.ConnectError) else "dropped"
                self.pool.eject(backend, reason)
                if attempt + 1 < min(ATTEMPTS, len(choice.order)):
                    self.metrics.retries.labels(reason=reason).inc()
                logger.warning("backend %s failed before responding: %r", backend.url, exc)
                last = error(f"backend {backend.url} unreachable", 502, "backend_unreachable")
                continue
            except asyncio.CancelledError:
                self._release(backend)
                raise
            if response is None:  # the client went away while the backend worked
                self._release(backend)
                return Response(status_code=499)
            answered = time.perf_counter()
            if response.status_code == 503 and attempt + 1 < min(ATTEMPTS, len(choice.order)):
                await response.aclose()
                self._release(backend)
                self.pool.eject(backend, "status_503")
                self.metrics.retries.labels(reason="status_503").inc()
                continue
            self.metrics.requests.labels(backend=backend.url, decision=decision).inc()
            if self.policy.name == "prefix":
                self.policy.record(route, backend)
                self.metrics.prefix(len(route.hashes), choice.hit_chunks if attempt == 0 else 0)
            out_headers = {k: v for k, v in response.headers.items()
                           if k.lower() not in HOP_BY_HOP and k.lower() not in OWN_HEADERS}
            out_headers["x-routed-to"] = backend.url
            self.metrics.overhead.observe((routed - start) + (time.perf_counter() - answered))
            return RelayResponse(response, lambda b=backend: self._release(b),
                                 status_code=response.status_code, headers=out_headers)
        self.metrics.failures.labels(reason="all_candidates_failed").inc()
        assert last is not None
        return last

    async def _send(self, request: Request, upstream: httpx.Request) -> httpx.Response | None:
        """Sends upstream while watching the client; None if the client left first."""
        send = asyncio.ensure_future(self.client.send(upstream, stream=True))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({send, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not send.done():
                send.cancel()
        if not send.done() or send.cancelled():
            await asyncio.gather(send, return_exceptions=True)
            return None
        return send.result()

    def _release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self._export(backend)

    def _export(self, backend: Backend) -> None:
        self.metrics.in_flight.labels(backend=backend.url).set(backend.in_flight)
