"""One pure-ASGI middleware for what every request needs, before any route runs.

- request id: `X-Request-Id` is honoured (or one is made) and echoed on the response;
- Bearer auth on `/v1/*`, `/tokenize` and `/detokenize` when an API key is set (probes,
  `/metrics` and `/version` stay open for kubelets and Prometheus);
- a request body size limit (413), by Content-Length and by counting streamed bytes;
- one access-log line per request: method, path, status, duration, request id, and the
  prompt text only when `--access-log-prompts` is on (handlers leave it in scope state).

Pure ASGI rather than BaseHTTPMiddleware, which would buffer or break SSE streaming and
the disconnect signal the streaming handlers rely on.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
import uuid
from typing import Any

from engine.entrypoints.errors import APIError, BodyTooLarge, error_bytes

access_logger = logging.getLogger("engine.access")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_KEYED_PATHS = ("/tokenize", "/detokenize")


def needs_key(path: str) -> bool:
    return path.startswith("/v1/") or path in _KEYED_PATHS


class ServerMiddleware:
    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int,
                 log_prompts: bool) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.log_prompts = log_prompts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id", "")
        # An unusable id (too long, odd characters: log injection) is replaced, not echoed.
        request_id = given if _SAFE_ID.match(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["arrival_time"] = start  # queue time and TTFT count from here
        status = {"code": 0}

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            error = self._precheck(scope["path"], headers)
            if error is not None:
                await _send_error(send_wrapper, error)
                return
            await self.app(scope, self._limited(receive), send_wrapper)
        except asyncio.CancelledError:
            if status["code"] == 0:  # cancelled before answering (client gone, shutdown)
                status["code"] = 499
            raise
        except Exception:
            if status["code"] == 0:  # the outer error middleware answers 500 after us
                status["code"] = 500
            raise
        finally:
            self._log(scope, status["code"], time.monotonic() - start, request_id, state)

    def _precheck(self, path: str, headers: dict[str, str]) -> APIError | None:
        if self.api_key is not None and needs_key(path):
            auth = headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                return APIError("missing or invalid API key: send 'Authorization: Bearer <key>'",
                                status=401, code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> APIError:
        return APIError(f"request body exceeds {self.max_body_bytes} bytes; send less or raise "
                        "--max-request-body-bytes", status=413, code="request_too_large")

    def _limited(self, receive: Any) -> Any:
        """Count body bytes as they arrive (chunked uploads have no Content-Length)."""
        seen = {"bytes": 0}

        async def wrapped() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                seen["bytes"] += len(message.get("body", b""))
                if seen["bytes"] > self.max_body_bytes:
                    raise BodyTooLarge(self._too_large())  # a 413 from the error handler
            return message

        return wrapped

    def _log(self, scope: dict, status: int, seconds: float, request_id: str,
             state: dict) -> None:
        client = scope.get("client") or ("-", 0)
        line = (f'{client[0]} "{scope["method"]} {scope["path"]}" {status} '
                f"{seconds * 1000:.1f}ms request_id={request_id}")
        if self.log_prompts and "prompt_log" in state:
            line += f" prompt={state['prompt_log']!r}"
        access_logger.info(line)


async def _send_error(send: Any, err: APIError) -> None:
    body = error_bytes(err)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
