"""Forwarding one request: pick, send, retry once before streaming, stream through.

A backend that refuses the connection or answers 503 before the response starts is
ejected and the request goes once to the next candidate; after the first byte reaches
the client there is no retry. Response bytes pass through as they arrive (SSE is never
buffered); a client that goes away closes the upstream connection, which makes the engine
abort the request.

The upstream client is aiohttp (its C HTTP parser and lean request path cost a fraction
of httpx's per request), one keep-alive pool for all backends; the request is served by
the one task uvicorn runs it in, plus one that waits for the client's disconnect.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from paged_router.metrics import RouterMetrics
from paged_router.policies import Choice, Policy, RouteRequest
from paged_router.pool import Backend, BackendPool

logger = logging.getLogger("paged_router")
# one JSON line per placement at DEBUG (`--log-decisions`): what the policy saw, what it chose
decisions = logging.getLogger("paged_router.decisions")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade", "host", "content-length"}
OWN_HEADERS = {"date", "server"}  # uvicorn adds the router's own
_DROPPED = {h.encode() for h in HOP_BY_HOP | OWN_HEADERS}  # response header names, bytes
ATTEMPTS = 2  # the pick and one retry
# below the engine's (uvicorn's) 5 s keep-alive, so the router never reuses a connection
# the engine is closing
KEEPALIVE_S = 4.0


def error(message: str, status: int, code: str, **headers: str) -> JSONResponse:
    kind = {400: "invalid_request_error", 401: "authentication_error",
            502: "server_error", 503: "service_unavailable_error"}.get(status, "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": code}}, status_code=status, headers=headers)


class ClientWatch:
    """Cancels the task serving a request when its client disconnects, while armed.

    One task awaits the ASGI `receive` (the body has been read already, so the next
    message is the disconnect); the serving task sends upstream and relays, so a client
    that leaves while the backend is silent (connecting, a long prefill) interrupts it at
    once and the upstream connection is closed."""

    def __init__(self, receive: Any) -> None:
        self.task, self.armed = asyncio.current_task(), False
        self.gone = asyncio.ensure_future(self._disconnected(receive))
        self.gone.add_done_callback(self._interrupt)

    @staticmethod
    async def _disconnected(receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    def _interrupt(self, gone: asyncio.Future) -> None:
        if self.armed and not gone.cancelled():
            self.task.cancel()

    def arm(self) -> None:
        """Watch on behalf of the current task (from its next await on)."""
        self.task, self.armed = asyncio.current_task(), True
        if self.gone.done():  # the client left while nobody watched
            self._interrupt(self.gone)

    def left(self) -> bool:
        """After a CancelledError: True if the client's leaving caused it (which is then
        consumed), False if the task is being cancelled from outside."""
        if not self.gone.done() or self.gone.cancelled():
            return False
        uncancel = getattr(self.task, "uncancel", None)  # Python >= 3.11
        if uncancel is not None:
            uncancel()
        return True

    def close(self) -> None:
        self.armed = False
        self.gone.cancel()


class RelayResponse(Response):
    """Relays an upstream response chunk by chunk as it arrives; whatever happens to the
    client (even a disconnect before the first byte), the upstream connection is closed
    unless the whole body went through, and the backend's in-flight count is released
    exactly once."""

    def __init__(self, upstream: aiohttp.ClientResponse, release: Callable[[], None],
                 watch: ClientWatch, headers: list[tuple[bytes, bytes]]) -> None:
        self.upstream, self._release, self.watch = upstream, release, watch
        self.status_code, self.raw_headers, self.background = upstream.status, headers, None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.watch.arm()
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            content = self.upstream.content
            while chunk := await content.readany():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self.watch.left():
                raise  # cancelled from outside (shutdown), not by the client leaving
        finally:
            self.watch.close()
            if self.upstream.content.at_eof():
                self.upstream.release()  # the whole body went through: reuse the connection
            else:
                self.upstream.close()  # the engine sees the connection drop and aborts
            self._release()


HASHED = ("prefix", "precise")  # the policies that route by the request's prefix hashes


class Forwarder:
    def __init__(self, pool: BackendPool, policy: Policy, hasher: Any,
                 metrics: RouterMetrics, *, connect_timeout: float = 2.0,
                 hold_seconds: float = 0.0, max_held: int = 64) -> None:
        self.pool, self.policy, self.hasher, self.metrics = pool, policy, hasher, metrics
        # with no backend at all, a request waits up to hold_seconds for the first one
        # (the SLO planner brings a replica back when it sees requests held), at most
        # max_held of them at once
        self.hold_seconds, self.max_held, self.held = hold_seconds, max_held, 0
        # made inside the running loop (the app's lifespan); no limit on connections, no
        # read timeout (a long generation is normal), compressed bodies pass as they are
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout),
            auto_decompress=False)

    async def aclose(self) -> None:
        await self.client.close()

    async def _hold(self) -> list:
        self.held += 1
        self.metrics.held.set(self.held)
        try:
            return await self.pool.wait_available(self.hold_seconds)
        finally:
            self.held -= 1
            self.metrics.held.set(self.held)

    def route_request(self, body: dict[str, Any], headers: Any) -> RouteRequest:
        session = headers.get("x-session-id") or body.get("user")
        hashes = self.hasher.request_hashes(body) if self.policy.name in HASHED else []
        return RouteRequest(hashes=hashes, session=str(session) if session else None)

    async def forward(self, request: Request, method: str, path: str, body: bytes,
                      route: RouteRequest, start: float | None = None) -> Response:
        start = time.perf_counter() if start is None else start
        backends = self.pool.available()
        if not backends and self.hold_seconds > 0:
            if self.held >= self.max_held:
                self.metrics.failures.labels(reason="hold_queue_full").inc()
                return error(f"no replica is serving and {self.held} requests already wait "
                             "for the first one to start; retry later", 503,
                             "no_healthy_backend",
                             **{"Retry-After": str(max(1, round(self.hold_seconds)))})
            backends = await self._hold()
            start = time.perf_counter()   # the wait is the cold start's, not the router's
        if not backends:
            self.metrics.failures.labels(reason="no_backend").inc()
            return error("no healthy backend: every engine replica is down or ejected; "
                         "retry shortly", 503, "no_healthy_backend", **{"Retry-After": "1"})
        choice = self.policy.choose(route, backends)
        if decisions.isEnabledFor(logging.DEBUG):
            decisions.debug(json.dumps({
                "t": time.time(), "decision": choice.decision, "pick": choice.order[0].url,
                "blocks": len(route.hashes), "key": f"{route.hashes[0]:x}" if route.hashes
                else None, "backends": [b.url for b in backends], **choice.detail}))
        headers = {k: v for k, v in request.headers.items() if k not in HOP_BY_HOP}
        query = request.scope.get("query_string", b"")
        url_tail = path + ("?" + query.decode("latin-1") if query else "")
        watch = ClientWatch(request.receive)
        watch.arm()
        relayed = False
        try:
            response = await self._attempts(watch, choice, route, method, url_tail, headers,
                                            body, start)
            relayed = isinstance(response, RelayResponse)
            return response
        except asyncio.CancelledError:
            if not watch.left():
                raise
            return Response(status_code=499)  # the client went away while the backend worked
        finally:
            if relayed:
                watch.armed = False  # the relay arms it again when it starts
            else:
                watch.close()

    async def _attempts(self, watch: ClientWatch, choice: Choice, route: RouteRequest,
                        method: str, url_tail: str, headers: dict[str, str], body: bytes,
                        start: float) -> Response:
        last: Response | None = None
        for attempt, backend in enumerate(choice.order[:ATTEMPTS]):
            decision = choice.decision if attempt == 0 else "retry"
            routed = time.perf_counter()
            backend.in_flight += 1
            self._export(backend)
            try:
                response = await self.client.request(
                    method, backend.url + url_tail, headers=headers, data=body or None,
                    allow_redirects=False)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                # refused, reset or dropped before the response headers
                self._release(backend)
                reason = ("connect_failed" if isinstance(exc, aiohttp.ClientConnectorError)
                          else "dropped")
                self.pool.eject(backend, reason)
                if attempt + 1 < min(ATTEMPTS, len(choice.order)):
                    self.metrics.retries.labels(reason=reason).inc()
                logger.warning("backend %s failed before responding: %r", backend.url, exc)
                last = error(f"backend {backend.url} unreachable", 502, "backend_unreachable")
                continue
            except asyncio.CancelledError:  # aiohttp has closed the connection
                self._release(backend)
                raise
            answered = time.perf_counter()
            if response.status == 503 and attempt + 1 < min(ATTEMPTS, len(choice.order)):
                response.close()
                self._release(backend)
                self.pool.eject(backend, "status_503")
                self.metrics.retries.labels(reason="status_503").inc()
                continue
            self.metrics.requests.labels(backend=backend.url, decision=decision).inc()
            if self.policy.name in HASHED:
                self.policy.record(route, backend)
                self.metrics.prefix(len(route.hashes), choice.hit_chunks if attempt == 0 else 0)
            out_headers = [(k.lower(), v) for k, v in response.raw_headers
                           if k.lower() not in _DROPPED]
            out_headers.append((b"x-routed-to", backend.url.encode()))
            self.metrics.overhead.observe((routed - start) + (time.perf_counter() - answered))
            return RelayResponse(response, lambda b=backend: self._release(b), watch,
                                 out_headers)
        self.metrics.failures.labels(reason="all_candidates_failed").inc()
        assert last is not None
        return last

    def _release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self._export(backend)

    def _export(self, backend: Backend) -> None:
        self.metrics.in_flight.labels(backend=backend.url).set(backend.in_flight)
