"""A request's output queue is bounded: cumulative outputs coalesce for a slow reader, and
a reader that falls too far behind gets a clear error while its engine requests abort."""
from __future__ import annotations

import asyncio
import queue

import pytest

from engine.entrypoints.errors import APIError
from engine.entrypoints.metrics import ServerMetrics
from engine.entrypoints.request_group import RequestGroup
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


class Owner:
    """The three things a RequestGroup uses of its AsyncEngine (GroupOwner)."""

    def __init__(self) -> None:
        self.metrics = ServerMetrics(model_name="m", max_model_len=4096)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self.released = 0

    def release_seats(self, count: int) -> None:
        self.released += count

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))


def output(rid: str, num_tokens: int, *, finished: bool = False) -> RequestOutput:
    tokens = list(range(num_tokens))
    c = CompletionOutput(index=0, text="x" * num_tokens, token_ids=tokens,
                         finish_reason="length" if finished else None)
    return RequestOutput(rid, None, [1, 2], [c], finished, RequestMetrics(0.0))


async def _take_all(group: RequestGroup) -> list[tuple[int, RequestOutput]]:
    return [item async for item in group]


def test_a_slow_reader_gets_the_latest_output_only():
    async def main():
        owner = Owner()
        group = RequestGroup(owner, ["r-0", "r-1"], max_backlog_tokens=1000)
        for n in range(1, 301):  # 300 steps while the reader sleeps
            group._deliver(0, output("r-0", n, finished=n == 300))
            group._deliver(1, output("r-1", n))
        assert len(group._pending) == 2  # one output per prompt, not 600
        group._deliver(1, output("r-1", 301, finished=True))
        items = await _take_all(group)
        assert [(i, len(o.outputs[0].token_ids)) for i, o in items] == [(0, 300), (1, 301)]
        assert owner.released == 2 and owner._commands.empty()
        assert group.max_backlog_seen == 301
    asyncio.run(main())


def test_a_reader_past_the_backlog_limit_is_aborted_with_a_clear_error():
    async def main():
        owner = Owner()
        group = RequestGroup(owner, ["r-0"], max_backlog_tokens=50)
        group._deliver(0, output("r-0", 10))
        first = await group.__aiter__().__anext__()
        assert len(first[1].outputs[0].token_ids) == 10
        for n in range(11, 62):  # 51 tokens beyond what the reader took
            group._deliver(0, output("r-0", n))
        with pytest.raises(APIError) as info:
            await _take_all(group)
        assert info.value.code == "stream_backlog_exceeded" and info.value.status == 429
        assert "--max-stream-backlog-tokens" in info.value.message
        assert owner._commands.get_nowait() == ("abort", "r-0")  # the engine frees it
        assert owner.released == 1
        assert owner.metrics.slow_reader_aborts._value.get() == 1
    asyncio.run(main())


def test_an_output_the_engine_failed_raises_for_this_request():
    async def main():
        owner = Owner()
        group = RequestGroup(owner, ["r-0", "r-1"], max_backlog_tokens=1000)
        bad = output("r-1", 3, finished=True)
        bad.outputs[0].finish_reason = "error"
        bad.error = "index out of range"
        group._deliver(1, bad)
        with pytest.raises(APIError) as info:
            await _take_all(group)
        assert info.value.status == 500 and "index out of range" in info.value.message
        assert owner._commands.get_nowait() == ("abort", "r-0")  # its sibling is aborted
    asyncio.run(main())
