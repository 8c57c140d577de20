"""The operator converges through API faults and a SIGKILL mid-reconcile.

A real operator process runs against the emulator while a seeded fraction of its calls
fail (500, 409 on writes, or take effect but answer after the client gave up). It is
SIGKILLed right after it creates its first Deployment (the rest of the children not yet
made) and started again. The end state: for each resource exactly one set of children,
each as the spec wants it and owned by it, the status conditions right, and nothing more
written once the faults stop (fault_harness.py has the machinery).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
import pytest_asyncio
from fault_harness import FaultyCluster, OperatorProcess
from operator_harness import (DEPLOYMENTS, NAMESPACE, PIS, RESOURCES, api_path, call, emulated,
                              condition, eventually, pis_body)

from paged_operator.kube import KINDS
from paged_operator.reconcile import contains, desired_children
from paged_api.service import DEFAULT_IMAGE, parse_spec

pytestmark = pytest.mark.asyncio
SPECS = {"alpha": {"model": {"uri": "hf://Qwen/Qwen2.5-0.5B-Instruct"},
                   "resources": {"gpus": 0}, "replicas": 2},
         "beta": {"model": {"uri": "pvc://models/llama-3-8b"}, "router": {"enabled": True},
                  "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}}
PDBS = "policy/v1/poddisruptionbudgets"
NOT_CHILDREN = {PIS, "v1/events", "v1/namespaces", "v1/pods",
                "apiextensions.k8s.io/v1/customresourcedefinitions"}


@pytest_asyncio.fixture()
async def faulty(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FaultyCluster]:
    """As conftest's `cluster`, with faults (none until `inject`)."""
    async with emulated(FaultyCluster, tmp_path, monkeypatch) as emulator:
        yield emulator


class NoOptionalApis:
    """Discovery as this emulator answers it: no KEDA, no prometheus-operator."""

    async def has(self, api: Any, kind_name: str) -> bool:
        return False


def resource_of(kind: str) -> str:
    return f"{KINDS[kind].api_version}/{KINDS[kind].plural}"


async def expected_children(cluster: FaultyCluster, name: str) -> list[dict[str, Any]]:
    owner = cluster.live(PIS)[NAMESPACE, name]
    spec = parse_spec(SPECS[name], name=name, namespace=NAMESPACE, default_image=DEFAULT_IMAGE)
    wanted, _ = await desired_children(None, NoOptionalApis(), spec)  # type: ignore[arg-type]
    kopf.adopt(wanted, owner=owner)
    return wanted


def owned(cluster: FaultyCluster, uid: str) -> dict[tuple[str, str], dict[str, Any]]:
    """{(resource, name): object} of every live object that names `uid` as its owner."""
    return {(resource, key[1]): obj for resource in RESOURCES if resource not in NOT_CHILDREN
            for key, obj in cluster.live(resource).items()
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])}


def one_set_of_children(cluster: FaultyCluster, name: str,
                        wanted: list[dict[str, Any]]) -> bool:
    uid = cluster.live(PIS)[NAMESPACE, name]["metadata"]["uid"]
    live = owned(cluster, uid)
    want = {(resource_of(c["kind"]), c["metadata"]["name"]): c for c in wanted}
    assert set(live) == set(want), f"{name}: children {sorted(live)} != {sorted(want)}"
    for key, child in want.items():
        assert contains(live[key], child), f"{name}: {key} differs from the desired child"
    return True


def status_right(cluster: FaultyCluster, name: str, *, ready: bool) -> bool:
    obj = cluster.live(PIS)[NAMESPACE, name]
    generation = obj["metadata"]["generation"]
    want = {"Ready": ready, "Progressing": not ready, "Degraded": False}
    for type_, ok in want.items():
        cond = condition(obj, type_)
        assert cond["status"] == str(ok), f"{name}: {type_} is {cond}"
        assert cond["observedGeneration"] == generation, f"{name}: {type_} is stale: {cond}"
    return True


def writes_to_children(cluster: FaultyCluster) -> dict[str, int]:
    return {f"{method} {r}": cluster.count(method, r) for method in ("POST", "PATCH", "DELETE")
            for r in RESOURCES if r not in NOT_CHILDREN}


async def quietly(cluster: FaultyCluster, method: str, path: str, body: Any = None) -> Any:
    """A user's call (kubectl), not subject to the injected faults."""
    faults, cluster.faults = cluster.faults, {}
    try:
        return await call(cluster, method, path, body)
    finally:
        cluster.faults = faults


async def test_faults_and_a_kill_mid_reconcile_converge_to_one_set_of_children(faulty, tmp_path):
    for name, spec in SPECS.items():
        await call(faulty, "POST", api_path(PIS), pis_body(name, spec))
    operator = OperatorProcess(tmp_path / "operator.log")
    at_kill: list[set] = []

    def kill() -> None:
        at_kill.append({r: set(faulty.live(r)) for r in RESOURCES if r not in NOT_CHILDREN})
        operator.kill()

    faulty.kill_when(lambda r: r.method.value == "POST" and r.resource is not None
                     and r.resource.plural == "deployments", kill)
    faulty.inject(seed=7, e500=0.06, e409=0.04, slow=0.02)
    try:
        await operator.start()
        await eventually(lambda: at_kill, timeout=20, message="the kill mid-reconcile")
        assert await operator.proc.wait() == -9
        # killed between children: a Deployment made, no PodDisruptionBudget yet
        assert at_kill[0][DEPLOYMENTS] and not at_kill[0][PDBS], at_kill
        await operator.start()
        wanted = {name: await expected_children(faulty, name) for name in SPECS}
        for name in SPECS:
            await eventually(lambda: one_set_of_children(faulty, name, wanted[name])
                             and status_right(faulty, name, ready=False), timeout=25,
                             message=f"{name} converged")
        # the engine Deployment becomes ready: Ready=True through the same faults
        generation = faulty.live(DEPLOYMENTS)[NAMESPACE, "alpha"]["metadata"]["generation"]
        await quietly(faulty, "PATCH", api_path(DEPLOYMENTS, "alpha", subresource="status"), {
            "status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                       "availableReplicas": 2, "observedGeneration": generation}})
        await eventually(lambda: status_right(faulty, "alpha", ready=True), timeout=20,
                         message="alpha Ready")
        injected = dict(faulty.injected)
        assert all(injected.get(f, 0) > 0 for f in ("500", "409", "slow")), injected

        # no faults: nothing more is created, deleted or replaced
        faulty.inject(seed=0)
        await eventually(lambda: all(one_set_of_children(faulty, n, wanted[n]) for n in SPECS))
        uids = {key: obj["metadata"]["uid"] for name in SPECS
                for key, obj in owned(faulty, faulty.live(PIS)[NAMESPACE, name][
                    "metadata"]["uid"]).items()}
        writes = writes_to_children(faulty)
        await asyncio.sleep(1.2)  # four resync periods
        assert writes_to_children(faulty) == writes
        assert {key: obj["metadata"]["uid"] for name in SPECS for key, obj in owned(
            faulty, faulty.live(PIS)[NAMESPACE, name]["metadata"]["uid"]).items()} == uids
    finally:
        faulty.inject(seed=0)
        await operator.stop()
    assert operator.starts == 2, operator.log()


async def test_a_call_that_times_out_is_an_api_error(faulty, monkeypatch):
    """A timeout (or a refused connection) is an ApiError like a 5xx, which reconciles turn
    into a quick retry; raw urllib3 errors would stall the resource for kopf's 60 s."""
    from paged_operator.kube import ApiError, KubeApi, load_configuration

    monkeypatch.setenv("PAGED_OPERATOR_API_TIMEOUT_SECONDS", "0.3")
    faulty.slow_seconds = 1.0
    api = KubeApi()
    await api.connect(load_configuration())
    try:
        faulty.inject(seed=0, slow=1.0)
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": NAMESPACE}, "data": {"a": "1"}}
        with pytest.raises(ApiError) as caught:
            await api.create(KINDS["ConfigMap"], NAMESPACE, body)
        assert caught.value.status == 0 and "timed out" in caught.value.message
        faulty.inject(seed=0)
        assert (NAMESPACE, "cm") in faulty.live("v1/configmaps")  # it did happen
    finally:
        await api.close(final=True)
