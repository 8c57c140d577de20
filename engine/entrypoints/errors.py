"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}.

Every 4xx/5xx the server sends goes through `error_body`, so clients (the `openai`
package among them) map them onto their own exception classes.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("engine.server")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error with an HTTP status that the client can act on."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers or {}


class BodyTooLarge(StarletteHTTPException):
    """Raised while the body streams in; an HTTPException because FastAPI turns any
    other exception from body reading into a generic 400."""

    def __init__(self, api_error: APIError) -> None:
        super().__init__(status_code=api_error.status, detail=api_error.message)
        self.api_error = api_error


def error_body(message: str, *, status: int, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPE_BY_STATUS.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    body = error_body(err.message, status=err.status, param=err.param, code=err.code)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def error_bytes(err: APIError) -> bytes:
    """The same body for places that write raw ASGI messages (middleware, SSE)."""
    return json.dumps(error_body(err.message, status=err.status, param=err.param,
                                 code=err.code)).encode()


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    """("body", "messages", 0, "role") -> "messages[0].role". Union members that pydantic
    puts in the location ("str", "list[str]", "constrained-int") are not fields: dropped."""
    out = ""
    for p in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in _TYPE_TAGS or "[" in p or "-" in p:
            continue
        else:
            out += f".{p}" if out else str(p)
    return out or None


def validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return APIError(f"request body is not valid JSON: {detail}".rstrip(": "),
                        code="invalid_json")
    param = _loc_to_param(tuple(first.get("loc", ())))
    if first.get("type") == "missing" and param is None:
        return APIError("request body is required (a JSON object)", code="missing_body")
    # A union field fails once per member: "must be a string; or a list ...".
    same = [e["msg"] for e in errors if _loc_to_param(tuple(e.get("loc", ()))) == param]
    message = f"{param or 'request body'}: {'; or '.join(dict.fromkeys(same))}"
    others = len(errors) - len(same)
    if others:
        message += f" (and {others} more error(s))"
    return APIError(message, param=param, code="invalid_value")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, as the OpenAPI document shows it."""
    error: ErrorDetail


_MEANING = {400: "invalid request: the message and `param` name the field",
            401: "missing or invalid API key", 404: "unknown model",
            413: "request body or prompt too large", 429: "stream client too slow",
            500: "the engine failed this request", 503: "loading, at capacity or shutting down"}


def document_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: the error statuses it can answer, in OpenAI's shape."""
    return {code: {"model": ErrorResponse, "description": _MEANING[code]} for code in codes}


def drop_default_422(app: FastAPI) -> None:
    """FastAPI documents 422 for every body; this server answers bad bodies with 400."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, BodyTooLarge):
            return error_response(exc.api_error)
        return error_response(APIError(str(exc.detail), status=exc.status_code,
                                       headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error while serving %s %s (answered 500)",
                         request.method, request.url.path)
        return error_response(APIError(f"internal error: {type(exc).__name__}", status=500))
