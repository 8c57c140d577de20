"""The engine requests of one HTTP request, read by its handler as one stream.

Outputs are cumulative (each carries the whole text and token list so far), so a newer
output of a prompt supersedes an older one: the group keeps only the latest per prompt
(deltas coalesce for a slow reader) and its memory stays one output per prompt however
slowly the client reads. How far the reader lags is measured in tokens produced but not
yet taken; past `max_backlog_tokens` the request is aborted with a clear error.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from engine.entrypoints.errors import APIError

if TYPE_CHECKING:
    from engine.entrypoints.metrics import ServerMetrics
    from engine.outputs import RequestOutput


class GroupOwner(Protocol):
    """What a group needs of the loop that admitted its requests (AsyncEngine)."""

    metrics: "ServerMetrics"

    def release_seats(self, count: int) -> None:
        """`count` admitted requests have ended (finished, failed or aborted)."""

    def abort(self, request_id: str) -> None:
        """Ask the engine to drop an unfinished request and free its blocks."""


def output_error(out: "RequestOutput") -> str | None:
    """The engine's message when it failed this one request (RequestOutput.error)."""
    error = out.error
    if error is None and any(c.finish_reason == "error" for c in out.outputs):
        error = "the engine failed this request"
    return error


def _num_tokens(out: "RequestOutput") -> int:
    return sum(len(c.token_ids) for c in out.outputs)


class RequestGroup:
    def __init__(self, owner: GroupOwner, request_ids: list[str], *,
                 max_backlog_tokens: int) -> None:
        self._owner = owner
        self.request_ids = request_ids
        self.max_backlog_tokens = max_backlog_tokens
        self._pending: dict[int, "RequestOutput"] = {}  # prompt index -> latest output
        self._taken_tokens: dict[int, int] = {}  # prompt index -> tokens handed to the reader
        self._error: BaseException | None = None
        self._wakeup = asyncio.Event()
        self._unfinished = set(request_ids)
        self.max_backlog_seen = 0

    # --- event loop thread, called by the engine side ----------------------------------

    def _deliver(self, index: int, out: "RequestOutput") -> None:
        if out.request_id not in self._unfinished:
            return  # closed already (the client left); the abort is on its way
        if out.finished:
            self._unfinished.discard(out.request_id)
            self._owner.release_seats(1)
        self._pending[index] = out
        self._wakeup.set()
        backlog = _num_tokens(out) - self._taken_tokens.get(index, 0)
        self.max_backlog_seen = max(self.max_backlog_seen, backlog)
        self._owner.metrics.observe_backlog(backlog)
        if backlog > self.max_backlog_tokens and not out.finished:
            self._owner.metrics.slow_reader_aborts.inc()
            self.fail(APIError(
                f"the client read the stream too slowly: {backlog} generated tokens were "
                f"waiting to be sent (limit {self.max_backlog_tokens}, "
                "--max-stream-backlog-tokens); the request was aborted", status=429,
                code="stream_backlog_exceeded"))

    def _fail(self, exc: BaseException) -> None:
        """The engine dropped these requests already (its step failed)."""
        self._owner.release_seats(len(self._unfinished))
        self._unfinished.clear()
        self._error = exc
        self._wakeup.set()

    def fail(self, exc: BaseException) -> None:
        """Abort what is unfinished and make the reader raise `exc` (shutdown, backlog)."""
        self.close()
        if self._error is None:
            self._error = exc
        self._wakeup.set()

    # --- the HTTP handler ---------------------------------------------------------------

    async def __aiter__(self) -> AsyncIterator[tuple[int, "RequestOutput"]]:
        """(prompt index, cumulative RequestOutput) until every request has finished;
        an output the engine failed raises an APIError (500) naming the engine's message."""
        while True:
            if self._error is not None:
                raise self._error
            if self._pending:
                index, out = next(iter(self._pending.items()))
                del self._pending[index]
                self._taken_tokens[index] = _num_tokens(out)
                error = output_error(out)
                if error is not None:
                    self.close()
                    raise APIError(f"the engine failed this request: {error}", status=500,
                                   code="request_failed")
                yield index, out
                continue
            if not self._unfinished:
                return
            self._wakeup.clear()
            await self._wakeup.wait()

    def close(self) -> None:
        """Abort what has not finished (client gone, error, shutdown). Idempotent."""
        if self._unfinished:
            self._owner.release_seats(len(self._unfinished))
            for rid in self._unfinished:
                self._owner.abort(rid)
            self._unfinished.clear()
