"""What the local-cluster tuning tests share: the stand-in engine's services, tunings,
kubectl helpers and the module's target service.

The engines are tests/local_cluster/fake_engine_pkg (the target's spec.env puts it first on
PYTHONPATH, and trials copy the target's spec): with maxNumSeqs 4 its inter-token gap is
5 ms, else 200 ms, over the 100 ms SLO (goodput 0: the gain over the target's maxNumSeqs 16
is large whatever the machine's load); blockSize 8 "runs out of memory" at start;
FAKE_ENGINE_SLOW_HOSTS makes the live service's own pods 50x slower (a gain that does not
hold after the apply); FAKE_ENGINE_HOST_ITL gives one service's own pods other gaps (a
setting better on the trial services and worse on the live one, which only PromQL on the
live traffic sees); at most maxNumSeqs requests stream at once, the rest wait (the
queueDepth the autoscaler reads); FAKE_ENGINE_REQUEST_LOG makes every pod log the requests
it receives (the served side of a replayed trace).
"""
from __future__ import annotations

import json

import pytest
import yaml

from cluster_harness import ROOT, LocalCluster

FAKE_ENGINE = ROOT / "tests" / "local_cluster" / "fake_engine_pkg"
TUNING = "serving.pagedinference.dev/tuning"
PREVIOUS = "serving.pagedinference.dev/previous-engine"
AUTOSCALING = {"maxReplicas": 2, "target": "50"}   # queueDepth 50: far above any capacity's


def service(name: str, *, slow_hosts: str = "", request_log: str = "",
            autoscaling: dict | None = None) -> dict:
    env = [{"name": "PYTHONPATH", "value": str(FAKE_ENGINE)},
           {"name": "FAKE_ENGINE_ITL", "value": json.dumps({"4": 0.005, "*": 0.2})}]
    if slow_hosts:
        env.append({"name": "FAKE_ENGINE_SLOW_HOSTS", "value": slow_hosts})
    if request_log:
        env.append({"name": "FAKE_ENGINE_REQUEST_LOG", "value": request_log})
    body = {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceService", "metadata": {"name": name},
            "spec": {"model": {"uri": "builtin://default", "servedName": "fake"},
                     "replicas": 1, "engine": {"blockSize": 16, "maxNumSeqs": 16},
                     "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi",
                                   "sharedMemory": "64Mi"},
                     "rollout": {"startupTimeoutSeconds": 60}, "env": env}}
    if autoscaling:
        body["spec"]["autoscaling"] = autoscaling
    return body


def tuning(name: str, target: str, *, space: dict, trials: int, mode: str = "Manual",
           min_gain: float = 1.1, duration: str = "3s", parallelism: int = 1,
           **extra) -> dict:
    """`extra`: more spec fields; a value None removes the field."""
    spec = {"targetRef": {"name": target}, "workload": "chat", "trials": trials,
            "parallelism": parallelism, "trialDuration": duration, "users": 2,
            "lengthScale": 0.25, "warmupRequests": 1,
            "slo": {"ttftSeconds": 1.0, "itlSeconds": 0.1},
            "searchSpace": space, "confirm": {"rounds": 2},
            "startupTimeout": "60s", "apply": {"mode": mode, "minGain": min_gain}, **extra}
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceTuning", "metadata": {"name": name},
            "spec": {k: v for k, v in spec.items() if v is not None}}


def apply(cluster: LocalCluster, *docs: dict) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


def finished(cluster: LocalCluster, name: str, timeout: float = 150) -> dict:
    def done() -> dict | None:
        body = cluster.json("get", "pit", name)
        return body if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed") \
            else None
    body = cluster.wait_for(done, timeout, f"tuning {name} to finish")
    assert body["status"]["phase"] == "Succeeded", body["status"]
    return body


def trial_services(cluster: LocalCluster, name: str) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.json("get", "pis", "-l",
                                                         f"{TUNING}={name}")["items"]]


def _defaults(field: str) -> dict:
    """The CRD's defaults under spec.<field>: what the API server fills in, as a real one."""
    crd = yaml.safe_load((ROOT / "charts/paged-inference-operator/crds/"
                          "pagedinferenceservices.yaml").read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"][field]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


ENGINE_DEFAULTS = _defaults("engine")
AUTOSCALING_DEFAULTS = _defaults("autoscaling")


def engine_of(cluster: LocalCluster, name: str) -> dict:
    return cluster.json("get", "pis", name)["spec"]["engine"]


def hpa_target(cluster: LocalCluster, name: str) -> str | None:
    found = cluster.kubectl("get", "hpa", name, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    return json.loads(found.stdout)["spec"]["metrics"][0]["pods"]["target"]["averageValue"]


@pytest.fixture(scope="module")
def target(local_cluster: LocalCluster) -> LocalCluster:
    apply(local_cluster, service("chat", autoscaling=AUTOSCALING))
    local_cluster.kubectl("wait", "pis/chat", "--for=condition=Ready", "--timeout=90s",
                          timeout=100)
    return local_cluster

