"""An event that carries a Deployment older than its owner's spec (a watch event queued
before the reconcile applied the new template, or a pod event read before that reconcile
ran) must not let the status claim the new generation: a client waiting for
observedGeneration >= N with Ready and no rollout in progress (the tuner applying a
setting, `kubectl wait`) would read the old pods as the new ones.

The real operator creates the children and reports the first generation; it is then
stopped, the spec changes, and the operator's event path (handlers._status_from_event)
runs on its own against the emulated API server, with the Deployment as each event would
carry it."""
from __future__ import annotations

import pytest
from operator_harness import DEPLOYMENTS, NAMESPACE, PIS, api_path, call, condition, eventually
from test_operator_lifecycle import create, deployment, pis

from paged_operator import handlers
from paged_operator.kube import KubeApi, load_configuration

pytestmark = pytest.mark.asyncio


async def rolled_out(cluster) -> None:
    """The Deployment controller's part: every replica of the current template ready."""
    live = deployment(cluster)
    n = live["spec"]["replicas"]
    await call(cluster, "PATCH", api_path(DEPLOYMENTS, "qwen", subresource="status"), {
        "status": {"replicas": n, "readyReplicas": n, "updatedReplicas": n,
                   "availableReplicas": n,
                   "observedGeneration": live["metadata"]["generation"]}})


async def event_memo() -> dict:
    api = KubeApi()
    await api.connect(load_configuration())
    return {"kube": api, "discovery": None, "config": handlers.OperatorConfig(),
            "locks": {}}


async def test_a_stale_deployment_does_not_claim_the_new_generation(cluster, operator):
    await create(cluster)
    await rolled_out(cluster)
    await eventually(lambda: condition(pis(cluster), "Ready")["status"] == "True"
                     and pis(cluster)["status"]["observedGeneration"] == 1)
    stale = deployment(cluster)   # generation 1, rolled out, the old template
    await operator.stop()         # nothing reconciles the change below

    await call(cluster, "PATCH", api_path(PIS, "qwen"), {"spec": {"engine": {"blockSize": 32}}})
    assert pis(cluster)["metadata"]["generation"] == 2
    memo = await event_memo()
    try:
        # a Deployment watch event from before the reconcile, and a pod event that reads
        # the Deployment itself before the reconcile ran: both see the old template
        for seen in (stale, None):
            await handlers._status_from_event("qwen", NAMESPACE, memo, seen=seen)
            status = pis(cluster)["status"]
            assert status["observedGeneration"] == 1, status
            assert condition(pis(cluster), "Ready")["observedGeneration"] == 1

        # the reconcile applies the new template; its controller has not rolled it yet
        spec = handlers.parse_spec(pis(cluster)["spec"], name="qwen", namespace=NAMESPACE)
        new = handlers.manifests.deployment(spec)
        await call(cluster, "PATCH", api_path(DEPLOYMENTS, "qwen"), {"spec": new["spec"]})
        assert deployment(cluster)["metadata"]["generation"] == 2
        await handlers._status_from_event("qwen", NAMESPACE, memo)
        status = pis(cluster)["status"]
        assert status["observedGeneration"] == 2, status
        assert condition(pis(cluster), "Progressing")["status"] == "True"
        assert condition(pis(cluster), "Ready")["status"] == "False"   # not caught up

        await rolled_out(cluster)
        await handlers._status_from_event("qwen", NAMESPACE, memo)
        assert condition(pis(cluster), "Ready")["status"] == "True"
        assert condition(pis(cluster), "Progressing")["status"] == "False"
        assert pis(cluster)["status"]["observedGeneration"] == 2

        # a change the Deployment does not carry (its NetworkPolicy) claims its generation
        # at once
        await call(cluster, "PATCH", api_path(PIS, "qwen"),
                   {"spec": {"networkPolicy": {"enabled": False}}})
        generation = pis(cluster)["metadata"]["generation"]
        assert generation == 3
        await handlers._status_from_event("qwen", NAMESPACE, memo)
        assert pis(cluster)["status"]["observedGeneration"] == 3
        assert condition(pis(cluster), "Ready")["status"] == "True"
    finally:
        await memo["kube"].close(final=True)
