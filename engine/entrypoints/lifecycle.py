"""The engine's life cycle in the server: load and warm it in a background thread while
uvicorn already answers `/livez`, start the engine loop, and stop it at shutdown."""
from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from engine.entrypoints.async_engine import AsyncEngine
from engine.entrypoints.metrics import ServerMetrics
from engine.entrypoints.request_log import RequestLog
from engine.entrypoints.server_state import ServerState
from engine.entrypoints.tokenization import Tokenization

logger = logging.getLogger("engine.server")


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


def _start_engine_loop(state: ServerState) -> None:
    """On the event loop, once the loader thread is done: serve from now on."""
    settings = state.settings
    state.async_engine = AsyncEngine(
        state.engine, metrics=state.metrics,
        max_waiting_requests=settings.max_waiting_requests,
        max_backlog_tokens=settings.max_stream_backlog_tokens)
    state.async_engine.start()
    state.ready = True
    logger.info("ready")


def _start_loader(state: ServerState, engine_factory: Callable[[], Any],
                  on_fatal: Callable[[], None] | None) -> None:
    """Load in a background thread; then start the engine loop, or call `on_fatal`."""
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
        loop.call_soon_threadsafe(_start_engine_loop, state)

    state.loader = threading.Thread(target=load, name="engine-loader", daemon=True)
    state.loader.start()


async def _stop(state: ServerState) -> None:
    """After uvicorn's shutdown: stop the engine loop, the tokenizer thread, the log."""
    state.ready = False
    if state.async_engine is not None:
        await state.async_engine.shutdown()
    if state.tokenization is not None:
        state.tokenization.close()
    if state.metrics is not None and state.metrics.request_log is not None:
        state.metrics.request_log.close()


def make_lifespan(state: ServerState, engine_factory: Callable[[], Any],
                  on_fatal: Callable[[], None] | None = None
                  ) -> Callable[[FastAPI], Any]:
    """The app's lifespan hook: start loading at startup, stop the engine at shutdown."""
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        _start_loader(state, engine_factory, on_fatal)
        yield
        await _stop(state)
    return lifespan
