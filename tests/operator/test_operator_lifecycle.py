"""The operator's life cycle against the emulated API server: create, roll, status, drift,
deletion, restart. Every assertion reads what the operator wrote over HTTP."""
from __future__ import annotations

import asyncio

import pytest
from operator_harness import (DEPLOYMENTS, NAMESPACE, PIS, api_path, call, condition,
                              eventually, pis_body)

pytestmark = pytest.mark.asyncio

CHILDREN = {"v1/configmaps": "qwen-engine-config", "v1/services": "qwen",
            DEPLOYMENTS: "qwen", "policy/v1/poddisruptionbudgets": "qwen"}
SPEC = {"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": "qwen-chat"},
        "replicas": 2,
        "resources": {"gpus": 1, "cpu": "4", "memory": "24Gi"},
        "engine": {"blockSize": 16, "gpuMemoryUtilization": 0.85, "maxNumSeqs": 64,
                   "maxModelLen": 4096, "enablePrefixCaching": False,
                   "extraArgs": ["--seed", "7"]}}


async def create(cluster, name="qwen", spec=SPEC):
    await call(cluster, "POST", api_path(PIS), pis_body(name, spec))
    for resource, child in CHILDREN.items():
        await eventually(lambda: (NAMESPACE, child.replace("qwen", name))
                         in cluster.live(resource), message=f"{resource} {child}")


def deployment(cluster, name="qwen"):
    return cluster.live(DEPLOYMENTS)[NAMESPACE, name]


def pis(cluster, name="qwen"):
    return cluster.live(PIS)[NAMESPACE, name]


async def test_create_makes_children_with_engine_flags_probes_gpus_security(cluster, operator):
    await create(cluster)
    dep = deployment(cluster)
    owner = pis(cluster)
    pod = dep["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert engine["image"] == "pagedinference/engine:0.1.0"
    assert engine["command"] == ["python", "-m", "engine", "serve"]
    assert engine["args"] == [
        "Qwen/Qwen2.5-0.5B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "qwen-chat", "--block-size", "16",
        "--gpu-memory-utilization", "0.85", "--max-num-seqs", "64", "--max-model-len", "4096",
        "--no-enable-prefix-caching", "--seed", "7"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert engine["resources"]["requests"] == {"cpu": "4", "memory": "24Gi",
                                               "nvidia.com/gpu": "1"}
    # vLLM's semantics: /health only once the model is loaded, /livez while it loads.
    assert engine["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert engine["startupProbe"]["failureThreshold"] * engine["startupProbe"][
        "periodSeconds"] >= 1800   # the default startup budget for loading a model
    assert engine["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert engine["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert engine["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert engine["securityContext"] == {
        "allowPrivilegeEscalation": False, "privileged": False,
        "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "emptyDir" in volumes[mounts["/model-cache"]]   # no modelCache asked
    assert {"name": "HF_HOME", "value": "/model-cache/huggingface"} in engine["env"]
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    for resource, child in CHILDREN.items():
        refs = cluster.live(resource)[NAMESPACE, child]["metadata"]["ownerReferences"]
        assert refs == [{"apiVersion": "serving.pagedinference.dev/v1alpha1",
                         "kind": "PagedInferenceService", "name": "qwen",
                         "uid": owner["metadata"]["uid"], "controller": True,
                         "blockOwnerDeletion": True}]
    settings = cluster.live("v1/configmaps")[NAMESPACE, "qwen-engine-config"]["data"]
    assert '"blockSize": 16' in settings["engine-settings.json"]
    service = cluster.live("v1/services")[NAMESPACE, "qwen"]["spec"]
    assert service["ports"][0]["port"] == 8000
    assert service["selector"] == dep["spec"]["selector"]["matchLabels"]
    status = await eventually(lambda: pis(cluster).get("status", {}).get("conditions")
                              and pis(cluster)["status"])
    assert status["endpoint"] == "http://qwen.llm.svc.cluster.local:8000"
    assert status["engine"]["maxNumSeqs"] == 64
    assert status["observedGeneration"] == 1
    # The operator authenticated with the kubeconfig's credentials on its own calls too.
    posts = [r for r in cluster if r.method.value == "POST" and r.resource == DEPLOYMENTS]
    assert posts and posts[0].headers["Authorization"] == "Bearer test-token"


async def test_block_size_change_rolls_the_pod_template(cluster, operator):
    await create(cluster)
    before = deployment(cluster)["spec"]["template"]
    await call(cluster, "PATCH", api_path(PIS, "qwen"), {"spec": {"engine": {"blockSize": 32}}})
    after = await eventually(
        lambda: "32" in deployment(cluster)["spec"]["template"]["spec"]["containers"][0][
            "args"] and deployment(cluster)["spec"]["template"], message="new args")
    key = "serving.pagedinference.dev/engine-config-checksum"
    assert after["metadata"]["annotations"][key] != before["metadata"]["annotations"][key]
    args = after["spec"]["containers"][0]["args"]
    assert args[args.index("--block-size") + 1] == "32"
    await eventually(lambda: pis(cluster)["status"]["observedGeneration"] == 2
                     and pis(cluster)["status"]["engine"]["blockSize"] == 32)
    config = cluster.live("v1/configmaps")[NAMESPACE, "qwen-engine-config"]["data"]
    assert '"blockSize": 32' in config["engine-settings.json"]


async def test_status_follows_deployment_readiness(cluster, operator):
    await create(cluster)
    await eventually(lambda: condition(pis(cluster), "Ready")["status"] == "False")
    assert condition(pis(cluster), "Progressing")["status"] == "True"
    generation = deployment(cluster)["metadata"]["generation"]
    ready = {"status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                        "availableReplicas": 2, "observedGeneration": generation}}
    await call(cluster, "PATCH", api_path(DEPLOYMENTS, "qwen", subresource="status"), ready)
    await eventually(lambda: condition(pis(cluster), "Ready")["status"] == "True",
                     message="Ready=True")
    assert condition(pis(cluster), "Progressing")["status"] == "False"
    assert condition(pis(cluster), "Degraded")["status"] == "False"
    assert pis(cluster)["status"]["readyReplicas"] == 2
    half = {"status": {"readyReplicas": 1, "conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": "0/3 nodes have nvidia.com/gpu"}]}}
    await call(cluster, "PATCH", api_path(DEPLOYMENTS, "qwen", subresource="status"), half)
    # Ready turns False as soon as a replica is lost; Degraded may come with a later write
    await eventually(lambda: condition(pis(cluster), "Ready")["status"] == "False"
                     and condition(pis(cluster), "Degraded")["status"] == "True")
    degraded = condition(pis(cluster), "Degraded")
    assert degraded["status"] == "True" and "nvidia.com/gpu" in degraded["message"]
    assert "1/2 replicas ready" in condition(pis(cluster), "Ready")["message"]


async def test_children_deleted_or_edited_by_hand_are_put_back(cluster, operator):
    await create(cluster)
    await call(cluster, "DELETE", api_path("v1/services", "qwen"))
    await call(cluster, "DELETE", api_path(DEPLOYMENTS, "qwen"))
    await eventually(lambda: (NAMESPACE, "qwen") in cluster.live("v1/services"))
    await eventually(lambda: (NAMESPACE, "qwen") in cluster.live(DEPLOYMENTS))
    await call(cluster, "PATCH", api_path(DEPLOYMENTS, "qwen"),
               {"spec": {"replicas": 7, "template": {"spec": {"containers": [
                   {"name": "engine", "image": "someone/else:latest"}]}}}})
    await eventually(lambda: deployment(cluster)["spec"]["replicas"] == 2
                     and deployment(cluster)["spec"]["template"]["spec"]["containers"][0][
                         "image"] == "pagedinference/engine:0.1.0", message="drift undone")


async def test_deleting_the_resource_leaves_nothing_behind(cluster, operator):
    await create(cluster)
    await call(cluster, "DELETE", api_path(PIS, "qwen"))
    await eventually(lambda: not cluster.live(PIS), message="custom resource gone")
    for resource in CHILDREN:
        await eventually(lambda: not cluster.live(resource), message=f"{resource} gone")
    posts = cluster.count("POST")
    await asyncio.sleep(1.0)  # > 3 resync periods: nothing may come back
    assert all(not cluster.live(resource) for resource in CHILDREN)
    assert cluster.count("POST") == posts


async def test_restart_and_repeated_reconciles_change_nothing(cluster, operator):
    await create(cluster)
    await create(cluster, name="llama", spec={"model": {"uri": "pvc://models/llama-3-8b"}})
    await eventually(lambda: pis(cluster).get("status", {}).get("conditions"))
    await asyncio.sleep(1.0)  # let start-up status writes settle
    child_resources = [*CHILDREN, PIS]
    posts = {r: cluster.count("POST", r) for r in child_resources}
    patches = {r: cluster.count("PATCH", r) for r in CHILDREN}
    assert all(posts[r] == 2 for r in CHILDREN), posts  # one per resource, no duplicates
    await operator.stop()
    await operator.start()
    await asyncio.sleep(1.5)  # resume handlers + several resync periods
    assert {r: cluster.count("POST", r) for r in child_resources} == posts
    assert {r: cluster.count("PATCH", r) for r in CHILDREN} == patches
    assert cluster.count("GET", DEPLOYMENTS) > 0  # it did look, and found nothing to do


async def test_with_a_router_ready_waits_for_a_router_pod(cluster, operator):
    await create(cluster, spec={**SPEC, "router": {"enabled": True}})
    await eventually(lambda: (NAMESPACE, "qwen-router") in cluster.live(DEPLOYMENTS),
                     message="router Deployment")
    generation = deployment(cluster)["metadata"]["generation"]
    ready = {"status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                        "availableReplicas": 2, "observedGeneration": generation}}
    await call(cluster, "PATCH", api_path(DEPLOYMENTS, "qwen", subresource="status"), ready)
    await eventually(lambda: condition(pis(cluster), "Ready").get("reason") == "RouterNotReady",
                     message="Ready=False, RouterNotReady")
    assert condition(pis(cluster), "Ready")["status"] == "False"
    router_ready = {"status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}
    await call(cluster, "PATCH", api_path(DEPLOYMENTS, "qwen-router", subresource="status"),
               router_ready)
    await eventually(lambda: condition(pis(cluster), "Ready")["status"] == "True",
                     message="Ready=True once a router pod is ready")
