"""Optional children and failure paths: invalid specs, autoscaling (HPA or KEDA), PodMonitor
once its CRD exists, model-cache claims, names taken by someone else's objects."""
from __future__ import annotations

import asyncio

import pytest
from operator_harness import (DEPLOYMENTS, NAMESPACE, PIS, PODMONITORS, api_path, call,
                              condition, eventually, pis_body)

pytestmark = pytest.mark.asyncio

HPA = "autoscaling/v2/horizontalpodautoscalers"
SCALEDOBJECTS = "keda.sh/v1alpha1/scaledobjects"
PVC = "v1/persistentvolumeclaims"
MODEL = {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}


def pis(cluster, name="svc"):
    return cluster.live(PIS)[NAMESPACE, name]


@pytest.mark.parametrize("engine, field", [
    ({"blockSize": 48}, "spec.engine.blockSize"),
    ({"gpuMemoryUtilization": 1.5}, "spec.engine.gpuMemoryUtilization"),
    ({"maxNumSeqs": 512, "maxNumBatchedTokens": 256}, "spec.engine.maxNumBatchedTokens"),
    ({"extraArgs": ["--port", "9000"]}, "spec.engine.extraArgs"),
])
async def test_invalid_spec_is_degraded_with_a_message_and_makes_no_children(
        cluster, operator, engine, field):
    await call(cluster, "POST", api_path(PIS), pis_body("svc", {"model": MODEL,
                                                                "engine": engine}))
    degraded = await eventually(lambda: condition(pis(cluster), "Degraded"))
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert field in degraded["message"]
    assert condition(pis(cluster), "Ready")["status"] == "False"
    await asyncio.sleep(0.8)  # a few resync periods: still nothing half-made
    for resource in (DEPLOYMENTS, "v1/services", "v1/configmaps",
                     "policy/v1/poddisruptionbudgets"):
        assert not cluster.live(resource), resource
        assert cluster.count("POST", resource) == 0
    # Fixing the spec recovers: the children appear and Degraded clears.
    await call(cluster, "PATCH", api_path(PIS, "svc"),
               {"spec": {"engine": {"blockSize": 16, "gpuMemoryUtilization": 0.9,
                                    "maxNumBatchedTokens": None, "extraArgs": []}}})
    await eventually(lambda: (NAMESPACE, "svc") in cluster.live(DEPLOYMENTS))
    await eventually(lambda: condition(pis(cluster), "Degraded")["status"] == "False")


async def test_autoscaling_adds_an_hpa_on_queue_depth_and_removing_it_deletes_it(
        cluster, operator):
    spec = {"model": MODEL, "replicas": 1,
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "metric": "queueDepth",
                            "target": 8}}
    await call(cluster, "POST", api_path(PIS), pis_body("svc", spec))
    hpa = await eventually(lambda: cluster.live(HPA).get((NAMESPACE, "svc")))
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "svc"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["metrics"][0]["pods"] == {
        "metric": {"name": "vllm:num_requests_waiting"},
        "target": {"type": "AverageValue", "averageValue": "8"}}
    deployment = cluster.live(DEPLOYMENTS)[NAMESPACE, "svc"]
    assert "replicas" not in deployment["spec"]  # the HPA owns the replica count
    await call(cluster, "PATCH", api_path(PIS, "svc"), {"spec": {"autoscaling": None}})
    await eventually(lambda: not cluster.live(HPA), message="HPA deleted")
    await eventually(lambda: cluster.live(DEPLOYMENTS)[NAMESPACE, "svc"]["spec"].get(
        "replicas") == 1, message="replicas back under the spec's control")


async def test_keda_scaled_object_instead_of_hpa_when_keda_is_installed(cluster, operator):
    cluster.declare(SCALEDOBJECTS, kind="ScaledObject")  # KEDA's CRD appears
    spec = {"model": MODEL, "autoscaling": {"maxReplicas": 3, "metric": "kvCacheUsage",
                                            "target": "0.7"}}
    await call(cluster, "POST", api_path(PIS), pis_body("svc", spec))
    scaled = await eventually(lambda: cluster.live(SCALEDOBJECTS).get((NAMESPACE, "svc")))
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "0.7"
    assert 'vllm:kv_cache_usage_perc{namespace="llm",model_name="svc"}' in \
        trigger["metadata"]["query"]
    await asyncio.sleep(0.5)
    assert not cluster.live(HPA)


async def test_pod_monitor_appears_once_its_crd_exists(cluster, operator):
    await call(cluster, "POST", api_path(PIS), pis_body("svc", {"model": MODEL}))
    await eventually(lambda: (NAMESPACE, "svc") in cluster.live(DEPLOYMENTS))
    assert not cluster.live(PODMONITORS)
    cluster.declare(PODMONITORS, kind="PodMonitor")  # prometheus-operator installed later
    monitor = await eventually(lambda: cluster.live(PODMONITORS).get((NAMESPACE, "svc")))
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    selector = cluster.live(DEPLOYMENTS)[NAMESPACE, "svc"]["spec"]["selector"]
    assert monitor["spec"]["selector"] == selector


async def test_model_cache_claim_and_pvc_model_are_mounted(cluster, operator):
    spec = {"model": {"uri": "pvc://weights/llama/8b", "servedName": "llama"},
            "modelCache": {"size": "200Gi", "storageClassName": "fast"}}
    await call(cluster, "POST", api_path(PIS), pis_body("svc", spec))
    claim = await eventually(lambda: cluster.live(PVC).get((NAMESPACE, "svc-model-cache")))
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    dep = await eventually(lambda: cluster.live(DEPLOYMENTS).get((NAMESPACE, "svc")))
    pod = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "svc-model-cache"}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "weights",
                                                         "readOnly": True}
    assert pod["containers"][0]["args"][0] == "/mnt/model/llama/8b"


async def test_a_name_taken_by_a_foreign_object_is_reported_not_overwritten(cluster, operator):
    foreign = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "svc", "namespace": NAMESPACE},
               "spec": {"ports": [{"port": 80}]}}
    await call(cluster, "POST", api_path("v1/services"), foreign)
    await call(cluster, "POST", api_path(PIS), pis_body("svc", {"model": MODEL}))
    degraded = await eventually(lambda: condition(pis(cluster), "Degraded")["status"] == "True"
                                and condition(pis(cluster), "Degraded"))
    assert degraded["reason"] == "ChildRejected" and "Service llm/svc" in degraded["message"]
    assert cluster.live("v1/services")[NAMESPACE, "svc"]["spec"]["ports"] == [{"port": 80}]


ROUTER_KINDS = {"v1/serviceaccounts": "svc-router", "rbac.authorization.k8s.io/v1/roles":
                "svc-router", "rbac.authorization.k8s.io/v1/rolebindings": "svc-router",
                "v1/services": "svc-engine", DEPLOYMENTS: "svc-router"}
NETPOL = "networking.k8s.io/v1/networkpolicies"


async def test_router_on_then_off_and_the_network_policy_follow_the_spec(cluster, operator):
    spec = {"model": MODEL, "router": {"enabled": True, "policy": "least-load"}}
    await call(cluster, "POST", api_path(PIS), pis_body("svc", spec))
    for resource, name in ROUTER_KINDS.items():
        await eventually(lambda: (NAMESPACE, name) in cluster.live(resource),
                         message=f"{resource} {name}")
    front = cluster.live("v1/services")[NAMESPACE, "svc"]["spec"]["selector"]
    router = cluster.live(DEPLOYMENTS)[NAMESPACE, "svc-router"]
    assert front == router["spec"]["selector"]["matchLabels"]
    assert "--policy" in router["spec"]["template"]["spec"]["containers"][0]["args"]
    policy = await eventually(lambda: cluster.live(NETPOL).get((NAMESPACE, "svc")))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # The router's Deployment is not the engine's: status still follows the engine.
    await call(cluster, "PATCH", api_path(DEPLOYMENTS, "svc-router", subresource="status"),
               {"status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}})
    await asyncio.sleep(0.3)
    assert condition(pis(cluster), "Ready")["status"] == "False"
    await call(cluster, "PATCH", api_path(PIS, "svc"),
               {"spec": {"router": {"enabled": False}, "networkPolicy": {"enabled": False}}})
    for resource, name in ROUTER_KINDS.items():
        await eventually(lambda: (NAMESPACE, name) not in cluster.live(resource),
                         message=f"{resource} {name} deleted")
    await eventually(lambda: not cluster.live(NETPOL), message="NetworkPolicy deleted")
    await eventually(lambda: cluster.live("v1/services")[NAMESPACE, "svc"]["spec"][
        "selector"]["app.kubernetes.io/name"] == "paged-inference-engine",
        message="the Service points at the engine pods again")
    assert (NAMESPACE, "svc") in cluster.live(DEPLOYMENTS)  # the engine stays
