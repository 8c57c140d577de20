"""The resync timer (handlers.resync): a resource deleted while a resync is running goes
as soon as the run ends, not a kopf polling period (60 s by default) later."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import kmock
import pytest
from operator_harness import (
    NAMESPACE, PIS, Cluster, Operator, api_path, call, emulated, eventually, pis_body,
)

pytestmark = pytest.mark.asyncio
PDBS = "policy/v1/poddisruptionbudgets"
SPEC = {"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}, "replicas": 2}


class HeldCluster(Cluster):
    """Holds the answer to the next read of a PodDisruptionBudget, once `hold` is set,
    until `release` is: only a reconcile reads them, so that is a resync in progress."""

    hold = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held, self.release = asyncio.Event(), asyncio.Event()

    async def _handle(self, request: kmock.Request) -> Any:
        if (self.hold and request.method.value == "GET" and request.resource is not None
                and request.resource.plural == "poddisruptionbudgets"):
            self.hold = False
            self.held.set()
            await self.release.wait()
        return await super()._handle(request)


async def test_deleting_a_resource_while_its_resync_runs(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="kopf.objects")
    async with emulated(HeldCluster, tmp_path, monkeypatch) as cluster:
        operator = Operator()
        await operator.start()
        try:
            await call(cluster, "POST", api_path(PIS), pis_body("qwen", SPEC))
            await eventually(lambda: (NAMESPACE, "qwen") in cluster.live(PDBS))
            cluster.hold = True
            await asyncio.wait_for(cluster.held.wait(), 10)  # a resync reads its children
            await call(cluster, "DELETE", api_path(PIS, "qwen"))
            # kopf has asked the timer to stop and found it still running
            await eventually(lambda: any("still exiting" in r.getMessage()
                                         for r in caplog.records), message="kopf waiting")
            cluster.release.set()
            await eventually(lambda: not cluster.live(PIS), timeout=5,
                             message="the resource gone")
        finally:
            cluster.release.set()
            await operator.stop()
