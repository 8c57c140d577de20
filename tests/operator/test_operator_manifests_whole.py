"""Whole child manifests, written out by hand: what the API server receives for a minimal
spec and for one that sets every optional field. Pure functions, no cluster
(test_operator_manifests.py pins the reasons behind single fields; these pin that nothing
else is there, found by scripts/mutation.py)."""
from __future__ import annotations

import hashlib
import json

from paged_operator import manifests
from paged_api.service import parse_spec

SELECTOR = {"app.kubernetes.io/name": "paged-inference-engine",
            "app.kubernetes.io/instance": "svc"}
LABELS = {**SELECTOR, "app.kubernetes.io/component": "engine",
          "app.kubernetes.io/managed-by": "paged-inference-operator"}
META = {"name": "svc", "namespace": "team", "labels": LABELS}
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "privileged": False,
                      "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                      "capabilities": {"drop": ["ALL"]}}
BASE_ENV = [{"name": "HF_HOME", "value": "/model-cache/huggingface"},
            {"name": "PAGED_MODEL_CACHE", "value": "/model-cache/paged-inference"},
            {"name": "HOME", "value": "/tmp"},
            {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
            {"name": "TRITON_CACHE_DIR", "value": "/tmp/.triton"}]
DEFAULT_FLAGS = ["--block-size", "16", "--gpu-memory-utilization", "0.9",
                 "--enable-prefix-caching"]


def minimal():
    return parse_spec({"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}}, name="svc",
                      namespace="team")


def full():
    return parse_spec({
        "model": {"uri": "pvc://weights/ckpt-MAX", "servedName": "chat"},
        "image": "registry.example/engine:2", "imagePullPolicy": "Always", "replicas": 3,
        "resources": {"gpus": 2, "gpuResourceName": "amd.com/gpu", "cpu": "8",
                      "memory": "64Gi"},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 6, "metric": "kvCacheUsage",
                        "target": "0.7", "prometheusServerAddress": "https://prom.example:9090"},
        "rollout": {"strategy": "Recreate", "startupTimeoutSeconds": 10},
        "modelCache": {"size": "100Gi", "storageClassName": "fast",
                       "accessModes": ["ReadWriteMany"]},
        "env": [{"name": "OMP_NUM_THREADS", "value": "4"}],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "nodeSelector": {"pool": "mi300"},
        "runtimeClassName": "rocm",
        "apiKeySecretRef": {"name": "engine-key"},
    }, name="svc", namespace="team")


def probe(path, period, failures):
    return {"httpGet": {"path": path, "port": "http"}, "timeoutSeconds": 5,
            "periodSeconds": period, "failureThreshold": failures}


def test_the_deployment_of_a_minimal_spec():
    spec = minimal()
    assert manifests.deployment(spec) == {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": META,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": SELECTOR},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 2400,   # the startup budget (1800 s) + 10 minutes
            "template": {
                "metadata": {"labels": LABELS, "annotations": {
                    "serving.pagedinference.dev/engine-config-checksum":
                        manifests.config_checksum(spec)}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": POD_SECURITY,
                    "containers": [{
                        "name": "engine", "image": "pagedinference/engine:0.1.0",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python", "-m", "engine", "serve"],
                        "args": ["Qwen/Qwen2.5-0.5B-Instruct", "--host", "0.0.0.0",
                                 "--port", "8000", "--served-model-name", "svc",
                                 *DEFAULT_FLAGS],
                        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                        "env": BASE_ENV,
                        "resources": {"requests": {"nvidia.com/gpu": "1"},
                                      "limits": {"nvidia.com/gpu": "1"}},
                        "startupProbe": probe("/health", 10, 180),
                        "readinessProbe": probe("/health", 5, 3),
                        "livenessProbe": probe("/livez", 10, 6),
                        "volumeMounts": [
                            {"name": "dshm", "mountPath": "/dev/shm"},
                            {"name": "tmp", "mountPath": "/tmp"},
                            {"name": "engine-config", "mountPath": "/etc/paged-inference",
                             "readOnly": True},
                            {"name": "model-cache", "mountPath": "/model-cache"}],
                        "securityContext": CONTAINER_SECURITY,
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "lifecycle": {"preStop": {"exec": {"command": [
                            "python", "-c", "import time; time.sleep(5)"]}}}}],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "engine-config", "configMap": {"name": "svc-engine-config"}},
                        {"name": "model-cache", "emptyDir": {}}]}}}}


def test_the_deployment_of_a_spec_with_every_option():
    spec = full()
    deployment = manifests.deployment(spec)
    body = deployment["spec"]
    assert "replicas" not in body                       # the autoscaler owns it
    assert body["strategy"] == {"type": "Recreate"}     # no rollingUpdate block
    assert body["progressDeadlineSeconds"] == 610
    pod = body["template"]["spec"]
    assert (pod["runtimeClassName"], pod["nodeSelector"], pod["tolerations"]) == (
        "rocm", {"pool": "mi300"}, [{"key": "gpu", "operator": "Exists"}])
    [container] = pod["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (
        "registry.example/engine:2", "Always")
    # a path in the claim ending in 'X' or '/' characters keeps its name
    assert container["args"] == ["/mnt/model/ckpt-MAX", "--host", "0.0.0.0", "--port", "8000",
                                 "--served-model-name", "chat",
                                 "--api-key-file", "/var/run/secrets/paged-inference/api-key",
                                 *DEFAULT_FLAGS]
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "amd.com/gpu": "2"},
        "limits": {"memory": "64Gi", "amd.com/gpu": "2"}}
    assert container["env"] == [*BASE_ENV, {"name": "OMP_NUM_THREADS", "value": "4"}]
    assert container["startupProbe"]["failureThreshold"] == 1   # 10 s at a 10 s period
    model_cache = [v for v in pod["volumes"] if v["name"] == "model-cache"]
    assert model_cache == [{"name": "model-cache",
                            "persistentVolumeClaim": {"claimName": "svc-model-cache"}}]


def test_a_pvc_model_at_the_claims_root_is_the_mount_point_itself():
    spec = parse_spec({"model": {"uri": "pvc://weights"}}, name="svc", namespace="team")
    assert manifests.engine_args(spec)[0] == "/mnt/model"


def test_cpu_threads_follow_a_fractional_request_and_yield_to_omp_num_threads():
    def threads(resources, env=()):
        spec = parse_spec({"model": {"uri": "a/b"}, "resources": resources, "env": list(env)},
                          name="svc", namespace="team")
        env = manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]["env"]
        return [e["value"] for e in env if e["name"] == "PAGED_CPU_THREADS"]
    assert threads({"gpus": 0, "cpu": "0"}) == ["1"]      # at least one
    assert threads({"gpus": 0, "cpu": "2"}) == ["2"]
    assert threads({"gpus": 0, "cpu": "2"}, [{"name": "OMP_NUM_THREADS", "value": "1"}]) == []


def test_manifests_share_no_mutable_state_with_each_other():
    spec = minimal()
    first = manifests.deployment(spec)["spec"]["template"]["spec"]
    first["securityContext"]["seccompProfile"]["type"] = "Unconfined"
    first["containers"][0]["securityContext"]["capabilities"]["drop"].clear()
    second = manifests.deployment(spec)["spec"]["template"]["spec"]
    assert second["securityContext"] == POD_SECURITY
    assert second["containers"][0]["securityContext"] == CONTAINER_SECURITY


def test_the_config_map_holds_sorted_settings_and_the_engine_command():
    spec = parse_spec({"model": {"uri": "a/b", "servedName": "chat"},
                       "engine": {"maxNumSeqs": 8, "extraArgs": ["--seed", "3"]}},
                      name="svc", namespace="team")
    args = ["a/b", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "chat",
            "--block-size", "16", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "8",
            "--enable-prefix-caching", "--seed", "3"]
    assert manifests.config_map(spec) == {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {**META, "name": "svc-engine-config"},
        "data": {
            "engine-settings.json": '{\n  "blockSize": 16,\n  "enablePrefixCaching": true,\n'
                                    '  "extraArgs": [\n    "--seed",\n    "3"\n  ],\n'
                                    '  "gpuMemoryUtilization": 0.9,\n  "maxNumSeqs": 8\n}\n',
            "model-uri": "a/b", "served-model-name": "chat", "engine-args": json.dumps(args)}}


def test_the_checksum_hashes_the_config_data_independently_of_key_order():
    spec = minimal()
    data = manifests.config_map(spec)["data"]
    reordered = dict(reversed(list(data.items())))
    assert manifests.config_checksum(spec) == hashlib.sha256(
        json.dumps(reordered, sort_keys=True).encode()).hexdigest()
    changed = parse_spec({"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"},
                          "engine": {"blockSize": 32}}, name="svc", namespace="team")
    assert manifests.config_checksum(changed) != manifests.config_checksum(spec)


def test_the_service_and_the_disruption_budget():
    spec = minimal()
    assert manifests.service(spec) == {
        "apiVersion": "v1", "kind": "Service", "metadata": META,
        "spec": {"type": "ClusterIP", "selector": SELECTOR,
                 "ports": [{"name": "http", "port": 8000, "targetPort": "http",
                            "protocol": "TCP"}]}}
    assert manifests.pod_disruption_budget(spec) == {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": META,
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": SELECTOR}}}


def test_the_pod_monitor_scrapes_engine_metrics_every_15_seconds():
    assert manifests.pod_monitor(minimal()) == {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": META,
        "spec": {"selector": {"matchLabels": SELECTOR},
                 "podMetricsEndpoints": [{"port": "http", "path": "/metrics",
                                          "interval": "15s"}]}}


def test_the_model_cache_claim_is_made_only_for_a_size():
    spec = full()
    assert manifests.model_cache_claim(spec) == {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {**META, "name": "svc-model-cache"},
        "spec": {"accessModes": ["ReadWriteMany"],
                 "resources": {"requests": {"storage": "100Gi"}},
                 "storageClassName": "fast"}}
    no_class = parse_spec({"model": {"uri": "a/b"}, "modelCache": {"size": "1Gi"}},
                          name="svc", namespace="team")
    assert manifests.model_cache_claim(no_class)["spec"] == {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    own = parse_spec({"model": {"uri": "a/b"}, "modelCache": {"claimName": "mine"}},
                     name="svc", namespace="team")
    assert manifests.model_cache_claim(own) is None
    assert manifests.model_cache_claim(minimal()) is None


def test_the_autoscalers_of_a_spec_with_autoscaling():
    spec = full()
    assert manifests.horizontal_pod_autoscaler(spec) == {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": META,
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "svc"},
                 "minReplicas": 2, "maxReplicas": 6,
                 "metrics": [{"type": "Pods", "pods": {
                     "metric": {"name": "vllm:kv_cache_usage_perc"},
                     "target": {"type": "AverageValue", "averageValue": "0.7"}}}],
                 "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}}}
    assert manifests.scaled_object(spec) == {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": META,
        "spec": {"scaleTargetRef": {"name": "svc"}, "minReplicaCount": 2, "maxReplicaCount": 6,
                 "triggers": [{"type": "prometheus", "metadata": {
                     "serverAddress": "https://prom.example:9090",
                     "query": 'sum(vllm:kv_cache_usage_perc{namespace="team",model_name="chat"})',
                     "threshold": "0.7"}}]}}
    assert manifests.horizontal_pod_autoscaler(minimal()) is None
    assert manifests.scaled_object(minimal()) is None

