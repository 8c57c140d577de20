"""The asynchronous engine loop: one thread steps the engine, asyncio tasks stream results.

`LLMEngine` is not thread-safe and `step()` is blocking CPU/GPU work, so the engine is
touched only by one dedicated thread. The event loop talks to it through a command
queue (add, abort, stop), drained between steps, so an abort frees its blocks before
the next step. Outputs travel back with `loop.call_soon_threadsafe`, one callback per
step, into one asyncio queue per HTTP request (`RequestGroup`).

Admission control lives here too: at most `max_num_seqs + max_waiting_requests`
engine requests are admitted at a time; past that, `submit` raises a 503 at once
instead of growing an unbounded backlog.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine.entrypoints.errors import APIError
from engine.entrypoints.metrics import ServerMetrics

logger = logging.getLogger("engine.server")


class RequestGroup:
    """The engine requests of one HTTP request (several prompts), read as one stream."""

    def __init__(self, owner: "AsyncEngine", request_ids: list[str]) -> None:
        self._owner = owner
        self.request_ids = request_ids
        self._queue: asyncio.Queue[tuple[int, Any] | BaseException] = asyncio.Queue()
        self._unfinished = set(request_ids)

    def _deliver(self, index: int, out: Any) -> None:  # event loop thread
        if out.request_id not in self._unfinished:
            return  # closed already (the client left); the abort is on its way
        if out.finished:
            self._unfinished.discard(out.request_id)
            self._owner._release(1)
        self._queue.put_nowait((index, out))

    def _fail(self, exc: BaseException) -> None:
        self._owner._release(len(self._unfinished))
        self._unfinished.clear()
        self._queue.put_nowait(exc)

    async def __aiter__(self) -> AsyncIterator[tuple[int, Any]]:
        """(prompt index, cumulative RequestOutput) until every request has finished."""
        while self._unfinished or not self._queue.empty():
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Abort what has not finished (client gone, error, shutdown). Idempotent."""
        if self._unfinished:
            self._owner._release(len(self._unfinished))
            for rid in self._unfinished:
                self._owner._commands.put(("abort", rid))
            self._unfinished.clear()


class AsyncEngine:
    def __init__(self, engine: Any, *, metrics: ServerMetrics, max_waiting_requests: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.capacity = engine.config.max_num_seqs + max_waiting_requests
        self.num_admitted = 0  # engine requests admitted and not yet finished (event loop)
        self.error: BaseException | None = None  # set when a step failed: the engine is dead
        self._commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # Engine thread only: request id -> (group, prompt index, params).
        self._routes: dict[str, tuple[RequestGroup, int, Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Abort whatever is left and stop the thread (after the HTTP side has drained)."""
        if self._thread is None:
            return
        self._commands.put(("stop",))
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    def _release(self, count: int) -> None:
        self.num_admitted -= count

    async def submit(self, prompts: Sequence[str | list[int]], params: Sequence[Any], *,
                     request_id: str, priority: int = 0, cache_salt: str | None = None,
                     arrival_time: float | None = None) -> RequestGroup:
        """Admit and add one engine request per prompt; raise APIError if refused."""
        if self.error is not None:
            raise APIError("the engine has failed and is restarting", status=503,
                           code="engine_dead")
        if self.num_admitted + len(prompts) > self.capacity:
            raise APIError(
                f"server is at capacity ({self.capacity} requests admitted); retry later",
                status=503, code="queue_full", headers={"Retry-After": "1"})
        ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        group = RequestGroup(self, ids)
        self.num_admitted += len(ids)
        assert self._loop is not None
        acks = [self._loop.create_future() for _ in ids]
        for i, (rid, prompt, sp, ack) in enumerate(zip(ids, prompts, params, acks)):
            kwargs = {"priority": priority, "cache_salt": cache_salt, "arrival_time": arrival_time}
            self._commands.put(("add", rid, prompt, sp, kwargs, group, i, ack))
        try:
            await asyncio.gather(*acks)
        except BaseException as exc:  # a bad prompt, or the client left while we waited
            group.close()
            if isinstance(exc, ValueError):
                raise APIError(str(exc), param="prompt" if "prompt" in str(exc) else None) \
                    from None
            raise
        return group

    # --- engine thread -------------------------------------------------------------------

    def _post(self, callback: Any, *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the process is exiting
            pass

    def _handle(self, command: tuple[Any, ...]) -> bool:
        """Apply one command; False on stop."""
        kind = command[0]
        if kind == "add":
            _, rid, prompt, sp, kwargs, group, index, ack = command
            try:
                self.engine.add_request(rid, prompt, sp, **kwargs)
            except Exception as exc:  # ValueError on bad input
                self._post(_settle, ack, exc)
                return True
            self._routes[rid] = (group, index, sp)
            self._post(_settle, ack, None)
        elif kind == "abort":
            route = self._routes.pop(command[1], None)
            if route is not None:
                self.engine.abort_request(command[1])
                self.metrics.observe_abort(command[1], route[2])
        elif kind == "stop":
            for rid, (_, _, sp) in list(self._routes.items()):
                self.engine.abort_request(rid)
                self.metrics.observe_abort(rid, sp)
            self._routes.clear()
            return False
        return True

    def _run(self) -> None:
        running = True
        try:
            while running:
                if not self.engine.has_unfinished_requests():
                    running = self._handle(self._commands.get())  # idle: block for work
                while running:
                    try:
                        running = self._handle(self._commands.get_nowait())
                    except queue.Empty:
                        break
                if running and self.engine.has_unfinished_requests():
                    self._deliver(self.engine.step())
                self.metrics.observe_stats(self.engine.get_stats())
        except Exception as exc:
            logger.exception("engine step failed; failing all requests")
            self.error = exc
            groups = {id(g): g for g, _, _ in self._routes.values()}
            self._routes.clear()
            err = APIError(f"engine failure: {type(exc).__name__}: {exc}", status=500)
            for g in groups.values():
                self._post(g._fail, err)
            self._refuse_until_stopped()

    def _refuse_until_stopped(self) -> None:
        """A dead engine still answers its queue, so no submit waits forever on an ack."""
        dead = APIError("the engine has failed and is restarting", status=503,
                        code="engine_dead")
        while True:
            command = self._commands.get()
            if command[0] == "stop":
                return
            if command[0] == "add":
                self._post(_settle, command[-1], dead)

    def _deliver(self, outputs: list[Any]) -> None:
        batch = []
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:
                continue  # aborted in the meantime
            group, index, sp = route
            self.metrics.observe_output(out, sp)
            if out.finished:
                del self._routes[out.request_id]
            batch.append((group, index, out))
        if batch:
            self._post(_deliver_batch, batch)


def _deliver_batch(batch: list[tuple[RequestGroup, int, Any]]) -> None:
    for group, index, out in batch:
        group._deliver(index, out)


def _settle(fut: asyncio.Future, exc: BaseException | None) -> None:
    if fut.done():  # cancelled: the client left during admission
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
