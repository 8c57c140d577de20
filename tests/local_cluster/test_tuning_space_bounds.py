"""A tuning without spec.searchSpace on the local cluster: the operator accepts it, and the
tuner Job bounds the settings table's ranges by the target's memory before its study
(status.searchSpace, status.searchSpaceNotes), or fails the tuning, naming what to change,
when the model fits at no memory fraction. Neither target needs to be Ready: the Job reads
their specs (the engine's CPU memory, spec.resources.memory, maxModelLen) and the built-in
model's checkpoint."""
from __future__ import annotations

import pytest

from tuning_harness import apply

pytestmark = pytest.mark.xdist_group("local_cluster_space_bounds")

LOCAL_CLUSTER_ARGS = ["--no-postgres"]


def service(name: str, *, memory: str, cpu_gib: float | None = None) -> dict:
    env = [{"name": "PAGED_CPU_MEMORY_GIB", "value": repr(cpu_gib)}] if cpu_gib else []
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceService", "metadata": {"name": name},
            "spec": {"model": {"uri": "builtin://default"}, "replicas": 0,
                     "engine": {"maxModelLen": 1024}, "env": env,
                     "resources": {"gpus": 0, "cpu": "1", "memory": memory}}}


def tuning(name: str, target: str) -> dict:
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceTuning", "metadata": {"name": name},
            "spec": {"targetRef": {"name": target}, "workload": "code", "trials": 2,
                     "trialDuration": "3s", "startupTimeout": "30s"}}


def test_the_job_bounds_the_default_space_or_fails_naming_the_memory(local_cluster) -> None:
    cluster = local_cluster
    # the tiny model's weights (~12 MiB in float32) do not fit in 8 MiB
    apply(cluster, service("small", memory="8Mi"), tuning("small-pit", "small"))
    # ~20 MiB of CPU memory: the weights and one 1024-token sequence need over 80 % of it
    apply(cluster, service("narrow", memory="1Gi", cpu_gib=0.019),
          tuning("narrow-pit", "narrow"))

    def failed() -> dict | None:
        status = cluster.json("get", "pit", "small-pit").get("status") or {}
        return status if status.get("phase") == "Failed" else None
    status = cluster.wait_for(failed, 120, "small-pit to fail")
    reason = status["decision"]["reason"]
    assert reason.startswith("spec.targetRef: small cannot hold builtin://default"), reason
    assert "raise spec.resources.memory above" in reason

    def bounded() -> dict | None:
        status = cluster.json("get", "pit", "narrow-pit").get("status") or {}
        return status if status.get("searchSpace") else None
    status = cluster.wait_for(bounded, 120, "narrow-pit's status.searchSpace")
    cluster.kubectl("delete", "pit", "narrow-pit", "--wait=false")
    fraction = status["searchSpace"]["gpuMemoryUtilization"]
    assert fraction["min"] > 0.8 and fraction["max"] == 0.95
    assert status["searchSpace"]["maxNumSeqs"]["max"] <= 64
    assert any(n.startswith("gpu_memory_utilization 0.5..0.95 -> ")
               for n in status["searchSpaceNotes"]), status["searchSpaceNotes"]
