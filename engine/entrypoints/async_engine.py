"""The asynchronous engine loop: one thread steps the engine, asyncio tasks stream results.

`LLMEngine` is not thread-safe and `step()` is blocking CPU/GPU work, so the engine is
touched only by one dedicated thread. The event loop talks to it through a command
queue (add, abort, stop), drained between steps, so an abort frees its blocks before
the next step. Outputs travel back with `loop.call_soon_threadsafe`, one callback per
step, into each HTTP request's `RequestGroup` (request_group.py).

Admission control lives here too: at most `max_num_seqs + max_waiting_requests`
engine requests are admitted at a time; past that, `submit` raises a 503 at once
instead of growing an unbounded backlog.

Faults: the engine fails a request it cannot serve on its own (an output with `error`,
a 500 for that HTTP request only). If `step()` itself raises, the requests in flight get
a 500 and are aborted, then a one-token probe request runs alone: if it succeeds and no
block leaked, the engine goes on serving; if it fails too, the fault is the device's or
the engine's, and the engine is dead (`/health` 500, new requests 503) until a restart.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.entrypoints.errors import APIError
from engine.entrypoints.metrics import ServerMetrics
from engine.entrypoints.request_group import RequestGroup

if TYPE_CHECKING:
    from engine import LLMEngine, SamplingParams
    from engine.outputs import RequestOutput

logger = logging.getLogger("engine.server")
_DEAD = "the engine has failed and is restarting"


class AsyncEngine:
    def __init__(self, engine: "LLMEngine", *, metrics: ServerMetrics,
                 max_waiting_requests: int, max_backlog_tokens: int = 1 << 30) -> None:
        self.engine = engine
        self.metrics = metrics
        self.capacity = engine.config.max_num_seqs + max_waiting_requests
        self.max_backlog_tokens = max_backlog_tokens
        self.num_admitted = 0  # engine requests admitted and not yet finished (event loop)
        self.error: BaseException | None = None  # set when the engine is dead
        self.groups: weakref.WeakSet[RequestGroup] = weakref.WeakSet()  # open (event loop)
        self._commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # Engine thread only: request id -> (group, prompt index, params).
        self._routes: dict[str, tuple[RequestGroup, int, SamplingParams]] = {}
        self._probe_ids = itertools.count()
        self._shape = None   # the shape of the step the loop is running (observe_step)
        self._step_ended: float | None = None   # when the last timed step ended (gaps)
        engine.step_observer = self._observe_shape
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

    def fail_open_requests(self, exc: APIError) -> int:
        """End every open request with `exc` (streams send it as an error event)."""
        groups = list(self.groups)
        for group in groups:
            group.fail(exc)
        return len(groups)

    def release_seats(self, count: int) -> None:
        self.num_admitted -= count

    def abort(self, request_id: str) -> None:
        """Drop the request in the engine thread, before its next step."""
        self._commands.put(("abort", request_id))

    async def submit(self, prompts: Sequence[str | list[int]], params: Sequence[SamplingParams],
                     *, request_id: str, priority: int = 0, cache_salt: str | None = None,
                     arrival_time: float | None = None) -> RequestGroup:
        """Admit and add one engine request per prompt; raise APIError if refused."""
        if self.error is not None:
            raise APIError(_DEAD, status=503, code="engine_dead")
        if self.num_admitted + len(prompts) > self.capacity:
            raise APIError(
                f"server is at capacity ({self.capacity} requests admitted); retry later",
                status=503, code="queue_full", headers={"Retry-After": "1"})
        ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        group = RequestGroup(self, ids, max_backlog_tokens=self.max_backlog_tokens)
        self.groups.add(group)
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
                message = str(exc)
                param = next((p for p in ("prompt", "stop_token_ids", "seed")
                              if p in message), None)
                raise APIError(message, param=param) from None
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
        while running:
            try:
                if not self.engine.has_unfinished_requests():
                    self._step_ended = None   # an idle wait is no gap between steps
                    running = self._handle(self._commands.get())  # idle: block for work
                while running:
                    try:
                        running = self._handle(self._commands.get_nowait())
                    except queue.Empty:
                        break
                if running and self.engine.has_unfinished_requests():
                    started, self._shape = time.perf_counter(), None
                    self._deliver(self.engine.step())
                    if self._shape is not None:   # a step ran: time it with its delivery
                        ended = time.perf_counter()
                        self.metrics.observe_step(self._shape, ended - started)
                        if self._step_ended is not None:
                            self.metrics.step_gap.observe(started - self._step_ended)
                        self._step_ended = ended
                self.metrics.observe_stats(self.engine.get_stats())
            except Exception as exc:
                if not self._recover(exc):
                    self._refuse_until_stopped()
                    return

    def _observe_shape(self, shape, seconds: float) -> None:
        self._shape = shape

    def _recover(self, exc: Exception) -> bool:
        """Fail the requests in flight, then probe the engine alone; False: it is dead."""
        self.metrics.engine_step_failures.inc()
        logger.error("engine step failed; failing the %d request(s) in flight", len(self._routes),
                     exc_info=exc)
        groups = {id(g): g for g, _, _ in self._routes.values()}
        err = APIError(f"engine failure: {type(exc).__name__}: {exc}", status=500,
                       code="engine_step_failed")
        try:
            for rid, (_, _, sp) in list(self._routes.items()):
                self.engine.abort_request(rid)
                self.metrics.observe_abort(rid, sp)
        finally:
            self._routes.clear()
            for g in groups.values():
                self._post(g._fail, err)
        try:
            self._probe()
        except Exception as probe_exc:  # the fault repeats on a one-request step
            logger.error("the engine failed a probe request alone too; it is dead until "
                         "restarted", exc_info=probe_exc)
            self.error = exc
            return False
        logger.info("engine probe succeeded; serving on")
        return True

    def _probe(self) -> None:
        """One greedy token of a one-token prompt, alone; then no KV block may be in use."""
        from engine import SamplingParams

        rid = f"probe-{next(self._probe_ids)}"
        self.engine.add_request(rid, [0], SamplingParams(temperature=0.0, max_tokens=1,
                                                         ignore_eos=True))
        for _ in range(8):
            if not self.engine.has_unfinished_requests():
                break
            self.engine.step()
        if self.engine.has_unfinished_requests():
            raise RuntimeError("the probe request did not finish")
        used = self.engine.get_stats().num_used_blocks
        if used:
            raise RuntimeError(f"{used} KV blocks still in use with no request in flight")

    def _refuse_until_stopped(self) -> None:
        """A dead engine still answers its queue, so no submit waits forever on an ack."""
        dead = APIError(_DEAD, status=503, code="engine_dead")
        while True:
            command = self._commands.get()
            if command[0] == "stop":
                return
            if command[0] == "add":
                self._post(_settle, command[-1], dead)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
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


def _deliver_batch(batch: list[tuple[RequestGroup, int, RequestOutput]]) -> None:
    for group, index, out in batch:
        group._deliver(index, out)


def _settle(fut: asyncio.Future, exc: BaseException | None) -> None:
    if fut.done():  # cancelled: the client left during admission
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
