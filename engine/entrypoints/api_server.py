"""The FastAPI application: routes, readiness, and the engine's life cycle.

Startup order: uvicorn listens first, so `/health` (liveness) answers while the model
loads in a background thread; `/ready` turns 200 only after the engine is built, a
warm-up request has run through it, and the engine loop has started. `/v1/*` answers
503 until then. Shutdown (SIGTERM): uvicorn stops accepting, lets in-flight requests
finish for the grace period, cancels the rest (their streams abort their engine
requests), then the lifespan hook stops the engine loop.
"""
from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.entrypoints.async_engine import AsyncEngine
from engine.entrypoints.errors import APIError, install_error_handlers
from engine.entrypoints.metrics import ServerMetrics
from engine.entrypoints.middleware import ServerMiddleware
from engine.entrypoints.protocol import (ChatCompletionRequest, CompletionRequest,
                                         DetokenizeRequest, TokenizeRequest)
from engine.entrypoints.serving import Serving

logger = logging.getLogger("engine.server")


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Server-side settings (the engine's own live in EngineConfig)."""
    api_key: str | None = None
    max_waiting_requests: int = 512
    max_request_body_bytes: int = 8 * 1024 * 1024
    shutdown_grace_period: float = 30.0
    access_log_prompts: bool = False


class ServerState:
    """What the routes read: None/503 until the loader thread has finished."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.engine: Any = None
        self.async_engine: AsyncEngine | None = None
        self.metrics: ServerMetrics | None = None
        self.tokenizer: Any = None  # the server's copy; the engine thread uses the engine's
        self.model_name = ""
        self.max_model_len = 0
        self.ready = False
        self.load_error: BaseException | None = None
        self.loader: threading.Thread | None = None

    def require_async_engine(self) -> AsyncEngine:
        if not self.ready or self.async_engine is None:
            raise APIError("the model is still loading; retry when /ready returns 200",
                           status=503, code="not_ready", headers={"Retry-After": "5"})
        return self.async_engine


def _device_summary(engine: Any) -> str:
    device = getattr(getattr(engine, "runner", None), "device", None)
    if device is None:
        return "device unknown"
    if device.type == "cpu":
        import torch
        return f"cpu, {torch.get_num_threads()} torch threads"
    return str(device)


def _load(state: ServerState, engine_factory: Callable[[], Any]) -> None:
    """Build and warm the engine (loader thread; the engine loop has not started yet)."""
    from engine import SamplingParams

    engine = engine_factory()
    for i in range(2):  # a prefill-and-decode pass, so the first user does not pay for it
        engine.add_request(f"warmup-{i}", "warm up the model", SamplingParams(
            temperature=0.0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    metrics = ServerMetrics(model_name=engine.model_name, max_model_len=engine.info.max_model_len)
    cfg = engine.config
    metrics.set_cache_config(block_size=cfg.block_size, num_gpu_blocks=engine.num_blocks,
                             enable_prefix_caching=cfg.enable_prefix_caching,
                             gpu_memory_utilization=cfg.gpu_memory_utilization)
    metrics.observe_stats(engine.get_stats())  # baseline: warm-up is not counted
    state.tokenizer = copy.deepcopy(engine.tokenizer)
    state.model_name, state.max_model_len = engine.model_name, engine.info.max_model_len
    state.metrics, state.engine = metrics, engine


def build_app(*, engine_factory: Callable[[], Any], settings: ServerSettings,
              on_fatal: Callable[[], None] | None = None) -> FastAPI:
    """The app; `engine_factory()` builds the LLMEngine in a background thread at startup.
    `on_fatal` is called if loading fails (the CLI stops uvicorn then, exiting 1)."""
    state = ServerState(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        loop = asyncio.get_running_loop()

        def load() -> None:
            try:
                t0 = time.monotonic()
                _load(state, engine_factory)
                logger.info("model %s loaded and warmed in %.1fs (%d KV blocks, %s)",
                            state.model_name, time.monotonic() - t0, state.engine.num_blocks,
                            _device_summary(state.engine))
            except BaseException as exc:  # report, and let the CLI exit non-zero
                logger.exception("loading the model failed")
                state.load_error = exc
                if on_fatal is not None:
                    loop.call_soon_threadsafe(on_fatal)
                return
            loop.call_soon_threadsafe(start)

        def start() -> None:
            state.async_engine = AsyncEngine(
                state.engine, metrics=state.metrics,
                max_waiting_requests=settings.max_waiting_requests)
            state.async_engine.start()
            state.ready = True
            logger.info("ready")

        state.loader = threading.Thread(target=load, name="engine-loader", daemon=True)
        state.loader.start()
        yield
        state.ready = False
        if state.async_engine is not None:
            await state.async_engine.shutdown()

    app = FastAPI(title="paged-inference", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    install_error_handlers(app)
    serving = Serving(state)

    @app.get("/health")
    async def health() -> Response:
        dead = state.load_error or (state.async_engine and state.async_engine.error)
        if dead:
            return JSONResponse({"status": "failed", "error": str(dead)}, status_code=500)
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        if state.ready and state.async_engine is not None and state.async_engine.error is None:
            return JSONResponse({"status": "ready", "model": state.model_name})
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            return Response(b"", media_type=CONTENT_TYPE_LATEST)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, str]:
        try:
            return {"version": importlib.metadata.version("paged-inference")}
        except importlib.metadata.PackageNotFoundError:  # running from a source checkout
            return {"version": "0+source"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        state.require_async_engine()
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "paged-inference", "root": state.engine.info.model_path,
            "max_model_len": state.max_model_len}]}

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        state.require_async_engine()
        serving._check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError("send exactly one of prompt or messages", param="prompt")
        if req.prompt is not None:
            ids = state.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            conversation = [{"role": m.role, "content": m.text(i)}
                            for i, m in enumerate(req.messages)]
            ids = list(state.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=req.add_generation_prompt, tokenize=True,
                return_dict=False))
        return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        state.require_async_engine()
        serving._check_model(req.model)
        vocab = len(state.tokenizer)
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(f"token id {bad} is outside the vocabulary [0, {vocab})",
                           param="tokens")
        return {"prompt": state.tokenizer.decode(req.tokens)}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request) -> Response:
        return await serving.completions(req, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Response:
        return await serving.chat(req, raw)

    app.add_middleware(ServerMiddleware, api_key=settings.api_key,
                       max_body_bytes=settings.max_request_body_bytes,
                       log_prompts=settings.access_log_prompts)
    return app
