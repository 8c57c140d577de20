"""What the server's routes share: its settings, and the state the loader thread fills in."""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.entrypoints.async_engine import AsyncEngine
from engine.entrypoints.errors import APIError
from engine.entrypoints.metrics import ServerMetrics
from engine.entrypoints.tokenization import Tokenization

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
