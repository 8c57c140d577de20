"""Each child's content pinned beyond the engine args: PDB, autoscalers, security contexts,
probes, volumes, NetworkPolicy, router objects. Pure functions: no cluster needed."""
from __future__ import annotations

import pytest

from paged_operator import manifests, manifests_access
from paged_api.service import parse_spec

SELECTOR = {"app.kubernetes.io/name": "paged-inference-engine",
            "app.kubernetes.io/instance": "svc"}


def spec_of(**fields):
    return parse_spec({"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}, **fields},
                      name="svc", namespace="team")


def engine_pod(spec):
    return manifests.deployment(spec)["spec"]["template"]["spec"]


def test_pdb_allows_exactly_one_pod_down():
    pdb = manifests.pod_disruption_budget(spec_of())
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": SELECTOR}}


def test_keda_query_uses_the_served_model_name_not_the_resource_name():
    spec = spec_of(model={"uri": "a/b", "servedName": "chat"},
                   autoscaling={"minReplicas": 2, "maxReplicas": 5, "target": 3,
                                "prometheusServerAddress": "http://prom.mon.svc:9090"})
    scaled = manifests.scaled_object(spec)["spec"]
    assert scaled["scaleTargetRef"] == {"name": "svc"}
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (2, 5)
    assert scaled["triggers"] == [{"type": "prometheus", "metadata": {
        "serverAddress": "http://prom.mon.svc:9090",
        "query": 'sum(vllm:num_requests_waiting{namespace="team",model_name="chat"})',
        "threshold": "3"}}]


@pytest.mark.parametrize("metric, name, target", [
    ("queueDepth", "vllm:num_requests_waiting", "5"),
    ("kvCacheUsage", "vllm:kv_cache_usage_perc", "0.8"),
])
def test_hpa_scales_the_deployment_on_a_per_pod_engine_metric(metric, name, target):
    hpa = manifests.horizontal_pod_autoscaler(spec_of(
        autoscaling={"maxReplicas": 4, "metric": metric}))["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "svc"}
    assert hpa["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": target}}}]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 4)
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300


@pytest.mark.parametrize("build", [
    lambda s: engine_pod(s),
    lambda s: manifests_access.router_deployment(s)["spec"]["template"]["spec"],
])
def test_pod_and_container_security_contexts(build):
    pod = build(spec_of(router={"enabled": True}))
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000,
                                      "runAsGroup": 1000, "fsGroup": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    for container in pod["containers"]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False, "privileged": False,
            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def test_engine_pod_never_gets_an_api_token_and_keeps_its_error_message():
    pod = engine_pod(spec_of())
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert pod["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_probes_follow_vllm_health_semantics_and_the_startup_budget():
    container = engine_pod(spec_of(rollout={"startupTimeoutSeconds": 95}))["containers"][0]
    startup, ready, live = (container[k] for k in ("startupProbe", "readinessProbe",
                                                   "livenessProbe"))
    assert startup["httpGet"] == ready["httpGet"] == {"path": "/health", "port": "http"}
    assert live["httpGet"] == {"path": "/livez", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] == 100  # ceil(95 / 10) * 10
    assert (ready["periodSeconds"], ready["failureThreshold"]) == (5, 3)
    assert (live["periodSeconds"], live["failureThreshold"]) == (10, 6)
    assert all(p["timeoutSeconds"] == 5 for p in (startup, ready, live))


def test_volumes_and_mounts():
    spec = spec_of(model={"uri": "pvc://weights/llama/8b"},
                   modelCache={"claimName": "hf-cache"}, resources={"sharedMemory": "8Gi"},
                   apiKeySecretRef={"name": "keys"})
    pod = engine_pod(spec)
    volumes = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes == {
        "dshm": {"emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        "tmp": {"emptyDir": {}},
        "engine-config": {"configMap": {"name": "svc-engine-config"}},
        "model-cache": {"persistentVolumeClaim": {"claimName": "hf-cache"}},
        "api-key": {"secret": {"secretName": "keys", "defaultMode": 0o440,
                               "items": [{"key": "api-key", "path": "api-key"}]}},
        "model": {"persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
    }
    assert {path: (m["name"], m.get("readOnly", False)) for path, m in mounts.items()} == {
        "/dev/shm": ("dshm", False), "/tmp": ("tmp", False),
        "/etc/paged-inference": ("engine-config", True), "/model-cache": ("model-cache", False),
        "/var/run/secrets/paged-inference": ("api-key", True), "/mnt/model": ("model", True)}


def test_builtin_models_need_no_claim_and_go_to_the_engine_unchanged():
    spec = spec_of(model={"uri": "builtin://smollm2-135m-instruct"}, resources={"gpus": 0})
    pod = engine_pod(spec)
    assert pod["containers"][0]["args"][0] == "builtin://smollm2-135m-instruct"
    assert manifests.model_cache_claim(spec) is None
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["PAGED_MODEL_CACHE"] == "/model-cache/paged-inference"


def test_network_policy_admits_the_namespace_and_the_listed_peers_on_the_engine_port():
    monitoring = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}
    policy = manifests_access.network_policy(spec_of(networkPolicy={"allowFrom": [monitoring]}))
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "svc",
                                        "app.kubernetes.io/managed-by":
                                            "paged-inference-operator"}},
        "policyTypes": ["Ingress"],   # egress stays open: downloads
        "ingress": [{"from": [{"podSelector": {}}, monitoring],
                     "ports": [{"protocol": "TCP", "port": 8000}]}]}
    # It selects both the engine and the router pods of this resource.
    router_labels = manifests_access.router_labels("svc")
    for labels in (manifests.labels("svc"), router_labels):
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert manifests_access.network_policy(spec_of(networkPolicy={"enabled": False})) is None
    assert manifests_access.network_policy(spec_of()) is not None  # on by default


def test_router_children_point_the_service_at_the_router_and_read_endpointslices_only():
    spec = spec_of(router={"enabled": True, "policy": "prefix", "replicas": 2})
    children = {(c["kind"], c["metadata"]["name"]): c
                for c in manifests_access.router_children(spec)}
    assert set(children) == {("ServiceAccount", "svc-router"), ("Role", "svc-router"),
                             ("RoleBinding", "svc-router"), ("Service", "svc-engine"),
                             ("Deployment", "svc-router")}
    assert children["Role", "svc-router"]["rules"] == [{
        "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
        "verbs": ["get", "list", "watch"]}]
    binding = children["RoleBinding", "svc-router"]
    assert binding["roleRef"]["name"] == "svc-router"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "svc-router",
                                    "namespace": "team"}]
    headless = children["Service", "svc-engine"]["spec"]
    assert headless["clusterIP"] == "None" and headless["selector"] == SELECTOR
    router = children["Deployment", "svc-router"]["spec"]
    assert router["replicas"] == 2
    assert router["template"]["spec"]["serviceAccountName"] == "svc-router"
    assert router["template"]["spec"]["containers"][0]["args"] == [
        "--discover", "svc-engine", "--policy", "prefix", "--port-name", "http",
        "--host", "0.0.0.0", "--port", "8000"]
    front = manifests.service(spec)["spec"]["selector"]
    assert front == router["selector"]["matchLabels"]
    assert front.items() <= router["template"]["metadata"]["labels"].items()
    assert front["app.kubernetes.io/name"] == "paged-inference-router"
    assert manifests.service(spec_of())["spec"]["selector"] == SELECTOR  # router off
    assert manifests_access.router_children(spec_of()) == []
