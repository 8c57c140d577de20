"""The server's routes: probes, metrics, discovery, tokenization and generation. Each
handler reads what it shares from `request.app.state` (`server`: the ServerState that
the loader thread fills in; `serving`: the completions and chat handlers), which
`api_server.build_app` sets before any request arrives."""
from __future__ import annotations

import importlib.metadata
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.entrypoints.chat_protocol import ChatCompletionRequest, TokenizeRequest
from engine.entrypoints.errors import APIError, ErrorResponse, document_errors
from engine.entrypoints.protocol import CompletionRequest, DetokenizeRequest
from engine.entrypoints.server_state import ServerState
from engine.entrypoints.serving import Serving
from engine.entrypoints.tokenizer_files import tokenizer_files

def _state(request: Request) -> ServerState:
    return request.app.state.server


def _serving(request: Request) -> Serving:
    return request.app.state.serving


async def health(request: Request) -> Response:
    status, body = _state(request).health()
    return JSONResponse(body, status_code=status)


async def ready(request: Request) -> Response:
    # an alias of /health (the tuner and old manifests)
    return await health(request)


async def livez(request: Request) -> Response:
    """Liveness: 200 while the model loads or serves; 500 once it cannot recover."""
    status, body = _state(request).health()
    return JSONResponse(body if status == 500 else {"status": "alive"},
                        status_code=500 if status == 500 else 200)


async def metrics(request: Request) -> Response:
    state = _state(request)
    if state.metrics is None:
        return Response(b"", media_type=CONTENT_TYPE_LATEST)
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def kv_events(request: Request) -> dict[str, Any]:
    """Where this engine publishes its KV cache events (engine/kv_events.py): the
    router's `--policy precise` learns the endpoints here; a `*` or 0.0.0.0 host means
    this server's own address."""
    state = _state(request)
    state.require_async_engine()
    publisher = getattr(state.engine, "kv_events", None)
    if publisher is None:
        raise APIError("KV cache events are off; start the engine with --kv-events-config "
                       "'{\"enable_kv_cache_events\": true}'", status=404, code="not_found")
    return publisher.info()


async def tokenizer(request: Request) -> dict[str, str]:
    """The files a router hashes requests with as this engine tokenizes them
    (engine/entrypoints/tokenizer_files.py): `--policy precise` without --tokenizer."""
    state = _state(request)
    state.require_async_engine()
    try:
        return tokenizer_files(state.engine.tokenizer, state.settings.chat_template)
    except ValueError as exc:
        raise APIError(str(exc), status=404, code="not_found") from None


async def version() -> dict[str, str]:
    try:
        return {"version": importlib.metadata.version("paged-inference")}
    except importlib.metadata.PackageNotFoundError:  # running from a source checkout
        return {"version": "0+source"}


async def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    state.require_async_engine()
    return {"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": int(time.time()),
        "owned_by": "paged-inference", "root": state.model_name, "parent": None,
        "max_model_len": state.max_model_len}]}


async def tokenize(req: TokenizeRequest, request: Request) -> dict[str, Any]:
    state = _state(request)
    _serving(request)._check_model(req.model)
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


async def detokenize(req: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state = _state(request)
    _serving(request)._check_model(req.model)
    assert state.tokenization is not None
    return {"prompt": await state.tokenization.decode(req.tokens)}


async def completions(req: CompletionRequest, raw: Request) -> Response:
    return await _serving(raw).completions(req, raw)


async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Response:
    return await _serving(raw).chat(req, raw)


probe_codes = {503: {"description": "loading: not ready to serve yet"},
               500: {"description": "failed: the model did not load or the engine died"}}


generation_errors = document_errors(400, 401, 404, 413, 429, 500, 503)


def add_routes(app: FastAPI) -> None:
    """Register the handlers above, in this order (the OpenAPI document's order)."""
    app.get("/health", responses=probe_codes)(health)
    app.get("/ready", responses=probe_codes)(ready)
    app.get("/livez", responses={500: probe_codes[500]})(livez)
    app.get("/metrics")(metrics)
    app.get("/kv_events", responses={
        404: {"model": ErrorResponse, "description": "KV events are off"},
        **document_errors(503)})(kv_events)
    app.get("/tokenizer", responses=document_errors(503))(tokenizer)
    app.get("/version")(version)
    app.get("/v1/models", responses=document_errors(401, 503))(models)
    app.post("/tokenize", responses=document_errors(400, 401, 404, 413, 503))(tokenize)
    app.post("/detokenize", responses=document_errors(400, 401, 404, 413, 503))(detokenize)
    app.post("/v1/completions", responses=generation_errors)(completions)
    app.post("/v1/chat/completions", responses=generation_errors)(chat_completions)
