"""An engine that cannot start turns its PagedInferenceService Degraded with the engine's
own last error, read from the pods (as a kubelet writes them), well before the
Deployment's progress deadline; the condition clears when the pod becomes ready."""
from __future__ import annotations

import pytest
from operator_harness import (DEPLOYMENTS, NAMESPACE, PIS, api_path, call, condition,
                              eventually, pis_body)

from paged_operator import manifests, status

PODS = "v1/pods"
ENGINE_ERROR = ("Traceback (most recent call last): ... FileNotFoundError: model path "
                "/models/missing does not exist")


def pod(name, owner="svc", **container):
    labels = {**manifests.labels(owner), "pod-template-hash": "5d9c"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"containers": [{"name": "engine", "image": "pagedinference/engine"}]},
            "status": {"phase": "Running",
                       "containerStatuses": [{"name": "engine", "ready": False,
                                              "restartCount": 0, **container}]}}


CRASHED = {"restartCount": 3,
           "state": {"waiting": {"reason": "CrashLoopBackOff",
                                 "message": "back-off 40s restarting failed container"}},
           "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                        "message": ENGINE_ERROR}}}


@pytest.mark.asyncio
async def test_engine_that_cannot_start_is_degraded_with_its_own_error(cluster, operator):
    spec = {"model": {"uri": "/models/missing"}, "resources": {"gpus": 0}}
    await call(cluster, "POST", api_path(PIS), pis_body("svc", spec))
    await eventually(lambda: (NAMESPACE, "svc") in cluster.live(DEPLOYMENTS))
    await eventually(lambda: condition(cluster.live(PIS)[NAMESPACE, "svc"], "Degraded")[
        "status"] == "False", message="healthy before any pod fails")
    # The kubelet creates the pod, then reports the crash through the status subresource.
    body = pod("svc-5d9c-x1")
    await call(cluster, "POST", api_path(PODS), {k: v for k, v in body.items()
                                                 if k != "status"})
    await call(cluster, "PATCH", api_path(PODS, "svc-5d9c-x1", subresource="status"),
               {"status": pod("svc-5d9c-x1", **CRASHED)["status"]})
    degraded = await eventually(
        lambda: (c := condition(cluster.live(PIS)[NAMESPACE, "svc"], "Degraded"))["status"]
        == "True" and c, message="Degraded from the pod's state")
    assert degraded["reason"] == "EngineFailing"
    assert "FileNotFoundError: model path /models/missing does not exist" in degraded["message"]
    assert "exited with code 1" in degraded["message"] and "CrashLoopBackOff" in \
        degraded["message"] and "svc-5d9c-x1" in degraded["message"]
    # Watched and listed with server-side selectors, never every pod of the namespace.
    selectors = [r.params.get("labelSelector") or "" for r in cluster
                 if r.resource is not None and r.resource.plural == "pods"
                 and r.method.value == "GET"]
    assert selectors and all("app.kubernetes.io/managed-by=paged-inference-operator" in s
                             for s in selectors), selectors
    assert any(r.params.get("watch") == "true" and "component=engine" in r.params.get(
        "labelSelector", "") for r in cluster), "the pod watch has no selector"
    # No Deployment condition was ever set: this did not wait for the progress deadline.
    assert not cluster.live(DEPLOYMENTS)[NAMESPACE, "svc"].get("status", {}).get("conditions")
    # Fixed (say, the volume appeared): the restarted container becomes ready.
    await call(cluster, "PATCH", api_path(PODS, "svc-5d9c-x1", subresource="status"),
               {"status": {"containerStatuses": [{
                   "name": "engine", "ready": True, "restartCount": 4,
                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                   "lastState": CRASHED["lastState"]}]}})
    await eventually(lambda: condition(cluster.live(PIS)[NAMESPACE, "svc"], "Degraded")[
        "status"] == "False", message="Degraded cleared once the engine is ready")


@pytest.mark.asyncio
async def test_pods_of_other_services_do_not_count(cluster, operator):
    await call(cluster, "POST", api_path(PIS), pis_body("svc", {"model": {"uri": "a/b"}}))
    await call(cluster, "POST", api_path(PIS), pis_body("other", {"model": {"uri": "a/b"}}))
    await eventually(lambda: (NAMESPACE, "other") in cluster.live(DEPLOYMENTS))
    await call(cluster, "POST", api_path(PODS), pod("other-1", owner="other", **CRASHED))
    await eventually(lambda: condition(cluster.live(PIS)[NAMESPACE, "other"], "Degraded")[
        "status"] == "True")
    # svc's own status may be written after other's (under load it was): wait for it
    svc = await eventually(lambda: condition(cluster.live(PIS)[NAMESPACE, "svc"], "Degraded"))
    assert svc["status"] == "False"


@pytest.mark.parametrize("container, pod_status, expected", [
    (CRASHED, {}, "exited with code 1 (Error): Traceback"),
    ({"state": {"waiting": {"reason": "ImagePullBackOff",
                            "message": "pull access denied for engine:typo"}}}, {},
     "ImagePullBackOff: pull access denied"),
    ({"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}, {},
     "exited with code 137 (OOMKilled)"),
    ({}, {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                          "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu"}]},
     "cannot be scheduled: 0/3 nodes are available"),
    ({"state": {"waiting": {"reason": "ContainerCreating"}}}, {}, None),   # still starting
    ({"state": {"running": {}}}, {}, None),                               # loading the model
    ({**CRASHED, "ready": True}, {}, None),                  # crashed once, serving now
])
def test_pod_failure_reads_the_kubelets_fields(container, pod_status, expected):
    body = pod("p", **container)
    body["status"].update(pod_status)
    found = status.pod_failure([body])
    assert (found is None) if expected is None else (expected in found), found


def test_pod_failure_ignores_terminating_pods_and_bounds_the_message():
    going = pod("old", **CRASHED)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert status.pod_failure([going]) is None
    noisy = pod("p", state={"terminated": {"exitCode": 1, "message": "x" * 5000 + " END"}})
    message = status.pod_failure([noisy])
    assert message.endswith("END (restarts: 0)") and len(message) < status.MESSAGE_LIMIT + 100
