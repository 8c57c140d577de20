"""The router's HTTP front: OpenAI-compatible routes forwarded to a replica, plus its own
`/health` (ready while any backend is) and `/metrics` (the `paged_router_*` families)."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from paged_router.engine_tokenizer import EngineTokenizer
from paged_router.hashing import CharChunkHasher, EngineBlockHasher, TokenBlockHasher
from paged_router.kv_follower import KVEventFollower
from paged_router.metrics import RouterMetrics
from paged_router.policies import PrecisePolicy, RouteRequest, make_policy
from paged_router.pool import BackendPool, normalize_url
from paged_router.proxy import Forwarder, error

logger = logging.getLogger("paged_router")


@dataclass
class RouterConfig:
    backends: list[str] = field(default_factory=list)
    discover: str | None = None          # the engine Service whose EndpointSlices to watch
    namespace: str | None = None
    port_name: str | None = None
    policy: str = "prefix"
    load_factor: float = 0.25
    hit_load_factor: float | None = None  # None: per policy (policies.make_policy)
    cache_balance: float | None | str = "default"  # per policy: policies.CACHE_BALANCE
    chunk_chars: int = 128
    max_chunks: int = 256
    table_size: int = 200_000
    tokenizer: str | None = None
    hash_block_size: int = 16
    # precise policy: backend URL -> (PUB, replay) endpoints; the others ask GET /kv_events
    kv_events_endpoints: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    health_interval: float = 1.0
    connect_timeout: float = 2.0
    api_key: str | None = None
    hold_seconds: float = 0.0            # --cold-start-hold
    max_held: int = 64                   # --cold-start-queue

    def __post_init__(self) -> None:
        if bool(self.backends) == bool(self.discover):
            raise ValueError("give exactly one of --backends URL[,URL...] or --discover SERVICE")


def _authorized(request: Request, api_key: str | None) -> bool:
    if api_key is None:
        return True
    auth = request.headers.get("authorization", "")
    token = auth[7:] if auth.lower().startswith("bearer ") else ""
    return hmac.compare_digest(token.encode(), api_key.encode())


def build_app(config: RouterConfig) -> Starlette:
    metrics = RouterMetrics()
    policy = make_policy(config.policy, load_factor=config.load_factor,
                         hit_load_factor=config.hit_load_factor,
                         cache_balance=config.cache_balance,
                         table_size=config.table_size)
    hasher = (TokenBlockHasher(config.tokenizer, config.hash_block_size, config.max_chunks)
              if config.tokenizer else CharChunkHasher(config.chunk_chars, config.max_chunks))
    pool = BackendPool(metrics, health_interval=config.health_interval,
                       scrape=config.policy == "least-load")
    pool.set_urls(config.backends)
    follower = None
    if isinstance(policy, PrecisePolicy):
        # the engines' own tokenizer (GET /tokenizer) unless --tokenizer names one
        hasher = (EngineBlockHasher(config.tokenizer, config.hash_block_size, config.max_chunks)
                  if config.tokenizer else
                  EngineTokenizer(config.hash_block_size, config.max_chunks))

        def on_block_size(url: str, size: int) -> None:
            if size != hasher.block_size:
                logger.warning("%s caches blocks of %d tokens, not %d: hashing with %d",
                               url, size, hasher.block_size, size)
                hasher.block_size = size

        follower = KVEventFollower(policy.index, metrics=metrics, on_block_size=on_block_size,
                                   endpoints={normalize_url(u): e for u, e in
                                              config.kv_events_endpoints.items()})

    async def follow_backends() -> None:
        """The index follows exactly the backends the pool offers now."""
        assert follower is not None
        while True:
            follower.track(b.url for b in pool.available())
            if isinstance(hasher, EngineTokenizer) and not hasher.ready and pool.available():
                await hasher.fetch(b.url for b in pool.available())
            await asyncio.sleep(0.1)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        forwarder = app.state.forwarder = Forwarder(pool, policy, hasher, metrics,
                                                    connect_timeout=config.connect_timeout,
                                                    hold_seconds=config.hold_seconds,
                                                    max_held=config.max_held)
        watcher = None
        if config.discover:
            from paged_router.discovery import EndpointSliceWatcher

            # precise: the slices' kv-events / kv-replay ports are each engine's event
            # endpoints, kept in the follower's own table (GET /kv_events otherwise)
            watcher = EndpointSliceWatcher(
                config.discover, pool, namespace=config.namespace, port_name=config.port_name,
                kv_events_endpoints=None if follower is None else follower.static)
            await watcher.start()
        await pool.start()
        if follower is not None:
            follower.track(b.url for b in pool.available())  # before /health can answer
        following = asyncio.create_task(follow_backends()) if follower else None
        try:
            yield
        finally:
            if following is not None:
                following.cancel()
                await follower.stop()
            await pool.stop()
            if watcher is not None:
                await watcher.stop()
            await forwarder.aclose()

    def unauthorized() -> JSONResponse:
        return error("missing or invalid API key: send 'Authorization: Bearer <key>'", 401,
                     "invalid_api_key", **{"WWW-Authenticate": "Bearer"})

    async def generate(request: Request) -> Response:
        if not _authorized(request, config.api_key):
            return unauthorized()
        raw = await request.body()
        start = time.perf_counter()  # the router's own time includes parsing and hashing
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error("the request body must be a JSON object", 400, "invalid_json")
        forwarder: Forwarder = app.state.forwarder
        route = forwarder.route_request(body, request.headers)
        return await forwarder.forward(request, "POST", request.scope["path"], raw, route,
                                       start=start)

    async def models(request: Request) -> Response:
        if not _authorized(request, config.api_key):
            return unauthorized()
        return await app.state.forwarder.forward(request, "GET", "/v1/models", b"",
                                                 RouteRequest())

    async def health(request: Request) -> Response:
        n = len(pool.available())
        body = {"healthy_backends": n, "backends": len(pool.all()), "policy": policy.name}
        ready = n > 0
        if follower is not None:  # what the index knows of each backend's KV events
            body["kv_events"] = {url: {"last_seq": seq, "blocks": policy.index.size(url)}
                                 for url, seq in follower.last_seq.items()}
            # a (re)started router serves once the engines' snapshots are in its index
            body["kv_index_ready"] = follower.ready()
            ready = ready and body["kv_index_ready"]
        if isinstance(hasher, EngineTokenizer):   # hashing needs the engines' tokenizer
            body["tokenizer"] = hasher.source or f"not yet: {hasher.error}"
            ready = ready and hasher.ready
        return JSONResponse(body, status_code=200 if ready else 503)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # 404, 405: in FastAPI's shape, as before
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)

    # plain Starlette: FastAPI's dependency solving and middleware cost ~0.2 ms a request
    # (benchmarks/bench_router_latency.py), and this app has no schema to offer
    app = Starlette(routes=[
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.pool, app.state.policy, app.state.metrics = pool, policy, metrics
    app.state.follower = follower
    return app
