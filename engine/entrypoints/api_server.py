"""The FastAPI application: routes, probes, and the engine's life cycle.

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

import asyncio
import copy
import importlib.metadata
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.entrypoints.async_engine import AsyncEngine
from engine.entrypoints.errors import (APIError, ErrorResponse, document_errors,
                                       drop_default_422, install_error_handlers)
from engine.entrypoints.metrics import ServerMetrics
from engine.entrypoints.middleware import ServerMiddleware
from engine.entrypoints.protocol import (ChatCompletionRequest, CompletionRequest,
                                         DetokenizeRequest, TokenizeRequest)
from engine.entrypoints.request_log import RequestLog
from engine.entrypoints.serving import Serving
from engine.entrypoints.tokenization import Tokenization
from engine.entrypoints.tokenizer_files import tokenizer_files

if TYPE_CHECKING:
    from engine import LLMEngine

logger = logging.getLogger("engine.server")


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Server-side settings (the engine's own live in EngineConfig)."""
    api_key: str | None = None
    max_waiting_requests: int = 512
    max_request_body_bytes: int = 8 * 1024 * 1024
    max_prompt_bytes: int = 2 * 1024 * 1024
    max_stream_backlog_tokens: int = 16384
    shutdown_grace_period: float = 30.0
    access_log_prompts: bool = False
    request_log: str | None = None  # JSONL file of per-request lengths (request_log.py)
    request_log_prefix_tokens: int = 32
    chat_template: str | None = None  # --chat-template's text (None: the tokenizer's)
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None


class ServerState:
    """What the routes read: None/503 until the loader thread has finished."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.engine: LLMEngine | None = None
        self.async_engine: AsyncEngine | None = None
        self.metrics: ServerMetrics | None = None
        self.tokenization: Tokenization | None = None  # the server's tokenizer copy
        self.model_name = ""
        self.max_model_len = 0
        self.ready = False
        self.load_error: BaseException | None = None
        self.loader: threading.Thread | None = None

    def require_async_engine(self) -> AsyncEngine:
        if not self.ready or self.async_engine is None:
            raise APIError("the model is still loading; retry when /health returns 200",
                           status=503, code="not_ready", headers={"Retry-After": "5"})
        return self.async_engine

    def health(self) -> tuple[int, dict[str, Any]]:
        """(status, body) of /health: 200 only when a request can be served now."""
        dead = self.load_error or (self.async_engine and self.async_engine.error)
        if dead:
            return 500, {"status": "failed", "error": str(dead)}
        if self.ready and self.async_engine is not None:
            return 200, {"status": "ready", "model": self.model_name}
        return 503, {"status": "loading"}

    def begin_shutdown(self, grace_period: float) -> None:
        """SIGTERM: when the grace period ends, end every open request with an error."""
        def end_open_requests() -> None:
            if self.async_engine is not None:
                count = self.async_engine.fail_open_requests(APIError(
                    "the server is shutting down; retry the request", status=503,
                    code="server_shutdown"))
                if count:
                    logger.info("grace period over: ended %d open request(s)", count)
        asyncio.get_running_loop().call_later(grace_period, end_open_requests)


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
    if getattr(engine, "kv_events", None) is not None:
        metrics.registry.register(engine.kv_events.collector())
    if getattr(engine, "offload", None) is not None:  # KV tiers (engine/kv_offload/)
        from engine.kv_offload.metrics import collector
        metrics.registry.register(collector(engine.offload, engine.model_name))
    if state.settings.request_log:
        metrics.request_log = RequestLog(state.settings.request_log,
                                         prefix_tokens=state.settings.request_log_prefix_tokens)
    state.tokenization = Tokenization(
        copy.deepcopy(engine.tokenizer), max_prompt_bytes=state.settings.max_prompt_bytes,
        vocab_size=min(engine.info.vocab_size, len(engine.tokenizer)),
        chat_template=state.settings.chat_template)
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
                max_waiting_requests=settings.max_waiting_requests,
                max_backlog_tokens=settings.max_stream_backlog_tokens)
            state.async_engine.start()
            state.ready = True
            logger.info("ready")

        state.loader = threading.Thread(target=load, name="engine-loader", daemon=True)
        state.loader.start()
        yield
        state.ready = False
        if state.async_engine is not None:
            await state.async_engine.shutdown()
        if state.tokenization is not None:
            state.tokenization.close()
        if state.metrics is not None and state.metrics.request_log is not None:
            state.metrics.request_log.close()

    app = FastAPI(title="paged-inference", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    install_error_handlers(app)
    serving = Serving(state)

    probe_codes = {503: {"description": "loading: not ready to serve yet"},
                   500: {"description": "failed: the model did not load or the engine died"}}

    @app.get("/health", responses=probe_codes)
    async def health() -> Response:
        status, body = state.health()
        return JSONResponse(body, status_code=status)

    @app.get("/ready", responses=probe_codes)
    async def ready() -> Response:  # an alias of /health (the tuner and old manifests)
        return await health()

    @app.get("/livez", responses={500: probe_codes[500]})
    async def livez() -> Response:
        """Liveness: 200 while the model loads or serves; 500 once it cannot recover."""
        status, body = state.health()
        return JSONResponse(body if status == 500 else {"status": "alive"},
                            status_code=500 if status == 500 else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            return Response(b"", media_type=CONTENT_TYPE_LATEST)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/kv_events", responses={
            404: {"model": ErrorResponse, "description": "KV events are off"},
            **document_errors(503)})
    async def kv_events() -> dict[str, Any]:
        """Where this engine publishes its KV cache events (engine/kv_events.py): the
        router's `--policy precise` learns the endpoints here; a `*` or 0.0.0.0 host means
        this server's own address."""
        state.require_async_engine()
        publisher = getattr(state.engine, "kv_events", None)
        if publisher is None:
            raise APIError("KV cache events are off; start the engine with --kv-events-config "
                           "'{\"enable_kv_cache_events\": true}'", status=404, code="not_found")
        return publisher.info()

    @app.get("/tokenizer", responses=document_errors(503))
    async def tokenizer() -> dict[str, str]:
        """The files a router hashes requests with as this engine tokenizes them
        (engine/entrypoints/tokenizer_files.py): `--policy precise` without --tokenizer."""
        state.require_async_engine()
        try:
            return tokenizer_files(state.engine.tokenizer, state.settings.chat_template)
        except ValueError as exc:
            raise APIError(str(exc), status=404, code="not_found") from None

    @app.get("/version")
    async def version() -> dict[str, str]:
        try:
            return {"version": importlib.metadata.version("paged-inference")}
        except importlib.metadata.PackageNotFoundError:  # running from a source checkout
            return {"version": "0+source"}

    @app.get("/v1/models", responses=document_errors(401, 503))
    async def models() -> dict[str, Any]:
        state.require_async_engine()
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "paged-inference", "root": state.model_name, "parent": None,
            "max_model_len": state.max_model_len}]}

    @app.post("/tokenize", responses=document_errors(400, 401, 404, 413, 503))
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        serving._check_model(req.model)
        assert state.tokenization is not None
        if (req.prompt is None) == (req.messages is None):
            raise APIError("send exactly one of prompt or messages", param="prompt")
        if req.prompt is not None:
            ids = (await state.tokenization.encode(
                [req.prompt], add_special_tokens=req.add_special_tokens))[0]
        else:
            conversation = [{"role": m.role, "content": m.text(i)}
                            for i, m in enumerate(req.messages or [])]
            ids = await state.tokenization.render_chat(
                conversation, add_generation_prompt=req.add_generation_prompt)
        return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}

    @app.post("/detokenize", responses=document_errors(400, 401, 404, 413, 503))
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        serving._check_model(req.model)
        assert state.tokenization is not None
        return {"prompt": await state.tokenization.decode(req.tokens)}

    generation_errors = document_errors(400, 401, 404, 413, 429, 500, 503)

    @app.post("/v1/completions", responses=generation_errors)
    async def completions(req: CompletionRequest, raw: Request) -> Response:
        return await serving.completions(req, raw)

    @app.post("/v1/chat/completions", responses=generation_errors)
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Response:
        return await serving.chat(req, raw)

    drop_default_422(app)
    app.add_middleware(ServerMiddleware, api_key=settings.api_key,
                       max_body_bytes=settings.max_request_body_bytes,
                       log_prompts=settings.access_log_prompts)
    return app
