"""The router's routes: the OpenAI-compatible ones forwarded to a replica, and its own
`/health` (ready while any backend is) and `/metrics`. Each handler reads the router's
parts from `request.app.state` (`router`: wiring.Router; `forwarder`: set by the lifespan)."""
from __future__ import annotations

import hmac
import json
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from paged_router.engine_tokenizer import EngineTokenizer
from paged_router.policies import RouteRequest
from paged_router.proxy import Forwarder, error
from paged_router.wiring import Router


def _authorized(request: Request, api_key: str | None) -> bool:
    if api_key is None:
        return True
    auth = request.headers.get("authorization", "")
    token = auth[7:] if auth.lower().startswith("bearer ") else ""
    return hmac.compare_digest(token.encode(), api_key.encode())


def unauthorized() -> JSONResponse:
    return error("missing or invalid API key: send 'Authorization: Bearer <key>'", 401,
                 "invalid_api_key", **{"WWW-Authenticate": "Bearer"})


async def generate(request: Request) -> Response:
    state = request.app.state
    if not _authorized(request, state.router.config.api_key):
        return unauthorized()
    raw = await request.body()
    start = time.perf_counter()  # the router's own time includes parsing and hashing
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return error("the request body must be a JSON object", 400, "invalid_json")
    forwarder: Forwarder = state.forwarder
    route = forwarder.route_request(body, request.headers)
    return await forwarder.forward(request, "POST", request.scope["path"], raw, route,
                                   start=start)


async def models(request: Request) -> Response:
    state = request.app.state
    if not _authorized(request, state.router.config.api_key):
        return unauthorized()
    return await state.forwarder.forward(request, "GET", "/v1/models", b"", RouteRequest())


async def health(request: Request) -> Response:
    router: Router = request.app.state.router
    pool, policy, follower, hasher = router.pool, router.policy, router.follower, router.hasher
    n = len(pool.available())
    body = {"healthy_backends": n, "backends": len(pool.all()), "policy": policy.name}
    ready = n > 0
    if follower is not None:  # what the index knows of each backend's KV events
        index = policy.index  # type: ignore[attr-defined]  # a follower: PrecisePolicy's
        body["kv_events"] = {url: {"last_seq": seq, "blocks": index.size(url)}
                             for url, seq in follower.last_seq.items()}
        # a (re)started router serves once the engines' snapshots are in its index
        body["kv_index_ready"] = follower.ready()
        ready = ready and body["kv_index_ready"]
    if isinstance(hasher, EngineTokenizer):   # hashing needs the engines' tokenizer
        body["tokenizer"] = hasher.source or f"not yet: {hasher.error}"
        ready = ready and hasher.ready
    if n == 0 and router.config.hold_seconds > 0:
        # --cold-start-hold: with no replica a request waits for the first one, so the
        # router stays ready (else its Service would send it nothing to hold, and its
        # liveness probe would restart it with the held requests at zero replicas)
        body["holding"] = True
        ready = True
    return JSONResponse(body, status_code=200 if ready else 503)


async def prometheus(request: Request) -> Response:
    registry = request.app.state.router.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # 404, 405: in FastAPI's shape, as before
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                        headers=exc.headers)


ROUTES = [
    Route("/v1/completions", generate, methods=["POST"]),
    Route("/v1/chat/completions", generate, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", prometheus, methods=["GET"]),
]
