"""The FastAPI application: wires the routes (routes.py), the engine's life cycle
(lifecycle.py) and the shared state (server_state.py) together.

Startup order: uvicorn listens first, so `/livez` (liveness) answers while the model
loads in a background thread; `/health` (and its alias `/ready`) turns 200 only after the
engine is built, a warm-up request has run through it, and the engine loop has started:
vLLM's meaning, so clients, routers and scripts can poll `/health` before sending.
`/v1/*` answers 503 until then. Shutdown (SIGTERM): uvicorn stops accepting, in-flight
requests may finish for the grace period; when it ends, every open request is ended with
an error (streams: an error event, then `data: [DONE]`), then the lifespan hook stops the
engine loop.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from engine.entrypoints.errors import drop_default_422, install_error_handlers
from engine.entrypoints.lifecycle import make_lifespan
from engine.entrypoints.middleware import ServerMiddleware
from engine.entrypoints.routes import add_routes
from engine.entrypoints.server_state import ServerSettings, ServerState
from engine.entrypoints.serving import Serving

__all__ = ["ServerSettings", "ServerState", "build_app"]


def build_app(*, engine_factory: Callable[[], Any], settings: ServerSettings,
              on_fatal: Callable[[], None] | None = None) -> FastAPI:
    """The app; `engine_factory()` builds the LLMEngine in a background thread at startup.
    `on_fatal` is called if loading fails (the CLI stops uvicorn then, exiting 1)."""
    state = ServerState(settings)
    lifespan = make_lifespan(state, engine_factory, on_fatal)
    app = FastAPI(title="paged-inference", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state  # what the routes read (routes.py)
    app.state.serving = Serving(state)
    install_error_handlers(app)
    add_routes(app)
    drop_default_422(app)
    app.add_middleware(ServerMiddleware, api_key=settings.api_key,
                       max_body_bytes=settings.max_request_body_bytes,
                       log_prompts=settings.access_log_prompts)
    return app
