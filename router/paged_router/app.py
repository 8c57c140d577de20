"""The router's HTTP front: OpenAI-compatible routes forwarded to a replica, plus its own
`/health` (ready while any backend is) and `/metrics` (the `paged_router_*` families).

Three parts: wiring.py builds the router's parts from its config, lifecycle.py starts and
stops them, routes.py answers requests with them; build_app puts them together."""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from paged_router.lifecycle import lifespan
from paged_router.routes import ROUTES, http_error
from paged_router.wiring import RouterConfig, wire

__all__ = ["RouterConfig", "build_app"]


def build_app(config: RouterConfig) -> Starlette:
    """The router's app, unstarted: its lifespan starts the pool, the watcher (--discover)
    and the follower (precise). `app.state` holds `router` (wiring.Router) and its `pool`,
    `policy`, `metrics` and `follower`; the lifespan adds `forwarder`."""
    router = wire(config)
    # plain Starlette: FastAPI's dependency solving and middleware cost ~0.2 ms a request
    # (benchmarks/bench_router_latency.py), and this app has no schema to offer
    app = Starlette(routes=ROUTES, exception_handlers={HTTPException: http_error},
                    lifespan=lifespan)
    app.state.router = router
    app.state.pool, app.state.policy = router.pool, router.policy
    app.state.metrics, app.state.follower = router.metrics, router.follower
    return app
