"""Discovery of optional APIs (reconcile.Discovery): one request shared by every reconcile
that asks at once, and an error in it reaches those reconciles but never the operator's
own task list (kopf re-raises at shutdown the error of every task it did not start)."""
from __future__ import annotations

import asyncio

import kopf
import pytest
from paged_operator.reconcile import Discovery

pytestmark = pytest.mark.asyncio


class Api:
    def __init__(self, answers: list[object]) -> None:
        self.answers, self.calls = answers, 0

    async def has_resource(self, kind: object) -> bool:
        self.calls += 1
        await asyncio.sleep(0)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)


async def test_concurrent_askers_share_one_request():
    api, discovery = Api([True]), Discovery(ttl_seconds=60)
    answers = await asyncio.gather(*(discovery.has(api, "PodMonitor") for _ in range(5)))
    assert answers == [True] * 5 and api.calls == 1


async def test_a_failed_discovery_reaches_the_askers_and_no_task_ends_in_error():
    api, discovery = Api([kopf.TemporaryError("the operator is shutting down", delay=60),
                          False]), Discovery(ttl_seconds=60)
    before = asyncio.all_tasks()
    with pytest.raises(kopf.TemporaryError, match="shutting down"):
        await discovery.has(api, "PodMonitor")
    started = [task for task in asyncio.all_tasks() | set(discovery_tasks(discovery))
               if task not in before and task is not asyncio.current_task()]
    assert started and all(task.done() and task.exception() is None for task in started)
    # A failure is not cached: the next reconcile asks again.
    assert await discovery.has(api, "PodMonitor") is False and api.calls == 2


def discovery_tasks(discovery: Discovery) -> list[asyncio.Future]:
    return [future for _, future in discovery._seen.values()]
