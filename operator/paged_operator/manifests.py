"""Desired child objects of a PagedInferenceService, as plain dicts (no I/O, no kopf).

Every builder takes the parsed ServiceSpec and returns a manifest with apiVersion, kind
and metadata.name set; owner references are added by the reconciler (kopf.adopt).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

from paged_api import settings as engine_settings

from paged_api import kv_cache
from . import kv_events
from paged_api.contract import MANAGED_BY
from paged_api.fields import quantity_value
from paged_api.model_source import MODEL_DIR
from paged_api.service import AUTOSCALING_METRICS, ENGINE_PORT, ServiceSpec

CHECKSUM_ANNOTATION = "serving.pagedinference.dev/engine-config-checksum"
# Writable mount points: the root filesystem is read-only.
MODEL_CACHE_DIR = "/model-cache"
CONFIG_DIR = "/etc/paged-inference"
SECRET_DIR = "/var/run/secrets/paged-inference"
API_KEY_FILE = f"{SECRET_DIR}/api-key"
ENGINE_UID = 1000


def selector_labels(name: str) -> dict[str, str]:
    # The Deployment selector is immutable: keep it to these two labels forever.
    return {"app.kubernetes.io/name": "paged-inference-engine",
            "app.kubernetes.io/instance": name}


def labels(name: str) -> dict[str, str]:
    return {**selector_labels(name),
            "app.kubernetes.io/component": "engine",
            "app.kubernetes.io/managed-by": MANAGED_BY}


def _meta(spec: ServiceSpec, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": labels(spec.name)}


def config_map_name(spec: ServiceSpec) -> str:
    return f"{spec.name}-engine-config"


def cache_claim_name(spec: ServiceSpec) -> str | None:
    cache = spec.model_cache
    if cache is None:
        return None
    return cache.claim_name or f"{spec.name}-model-cache"


def endpoint(spec: ServiceSpec) -> str:
    return f"http://{spec.name}.{spec.namespace}.svc.cluster.local:{ENGINE_PORT}"


def engine_args(spec: ServiceSpec) -> list[str]:
    key = ["--api-key-file", API_KEY_FILE] if spec.api_key else []
    return [spec.model.engine_arg, "--host", "0.0.0.0", "--port", str(ENGINE_PORT),
            "--served-model-name", spec.model.served_name, *key,
            *kv_events.engine_args(spec), *kv_cache.engine_args(spec.kv_cache),
            *spec.engine.flags()]


def config_map(spec: ServiceSpec) -> dict[str, Any]:
    settings = json.dumps(spec.engine.applied(), indent=2, sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(spec, config_map_name(spec)),
            "data": {"engine-settings.json": settings + "\n",
                     "model-uri": spec.model.uri,
                     "served-model-name": spec.model.served_name,
                     "engine-args": json.dumps(engine_args(spec))}}


def config_checksum(spec: ServiceSpec) -> str:
    """Hash of the ConfigMap's data; put on the pod template so a settings change rolls pods."""
    data = json.dumps(config_map(spec)["data"], sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def _resources(spec: ServiceSpec) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if spec.cpu:
        requests["cpu"] = spec.cpu
    request, limit = kv_cache.memory(spec.memory, spec.kv_cache)  # + the host tier
    requests |= {"memory": request} if request else {}
    limits |= {"memory": limit} if limit else {}
    if spec.gpus:
        # Extended resources cannot be overcommitted: requests must equal limits.
        requests[spec.gpu_resource_name] = limits[spec.gpu_resource_name] = str(spec.gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _probes(spec: ServiceSpec) -> dict[str, Any]:
    """vLLM's health semantics: /health answers 200 only once the model is loaded and the
    engine can serve; /livez answers while the model is still loading."""
    def http(path: str, **kw: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "timeoutSeconds": 5, **kw}
    period = 10
    # Until /health answers 200 the model is still downloading or loading: give it the
    # whole startup budget before the kubelet restarts the container.
    startup_failures = max(1, math.ceil(spec.rollout.startup_timeout_seconds / period))
    return {"startupProbe": http("/health", periodSeconds=period,
                                 failureThreshold=startup_failures),
            "readinessProbe": http("/health", periodSeconds=5, failureThreshold=3),
            "livenessProbe": http("/livez", periodSeconds=10, failureThreshold=6)}


def _volumes(spec: ServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shared_memory}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "engine-config", "configMap": {"name": config_map_name(spec)}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "model-cache", "mountPath": MODEL_CACHE_DIR},
    ]
    claim = cache_claim_name(spec)
    volumes.append({"name": "model-cache", **({"persistentVolumeClaim": {"claimName": claim}}
                                             if claim else {"emptyDir": {}})})
    if spec.api_key is not None:  # a file, never argv or env: readable by the engine's group
        volumes.append({"name": "api-key", "secret": {
            "secretName": spec.api_key.name, "defaultMode": 0o440,
            "items": [{"key": spec.api_key.key, "path": "api-key"}]}})
        mounts.append({"name": "api-key", "mountPath": SECRET_DIR, "readOnly": True})
    kv_volumes, kv_mounts = kv_cache.volumes(spec.kv_cache)  # the disk tier's
    volumes, mounts = volumes + kv_volumes, mounts + kv_mounts
    if spec.model.kind == "pvc":
        volumes.append({"name": "model", "persistentVolumeClaim": {
            "claimName": spec.model.claim_name, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": MODEL_DIR, "readOnly": True})
    return volumes, mounts


def _cpu_threads_env(spec: ServiceSpec) -> list[dict[str, Any]]:
    """A CPU-only engine (gpus: 0) with a CPU request gets one torch thread per requested core.
    torch would otherwise start one per core of the node, and its spinning OpenMP workers
    stall when neighbouring pods hold those cores (docs/engine.md, "CPU threads"). spec.env wins."""
    if spec.gpus or not spec.cpu:
        return []
    if any(e.get("name") in ("PAGED_CPU_THREADS", "OMP_NUM_THREADS") for e in spec.env):
        return []
    cores = quantity_value(spec.cpu) or 1.0
    return [{"name": "PAGED_CPU_THREADS", "value": str(max(1, math.floor(cores)))}]


def _cpu_memory_env(spec: ServiceSpec) -> list[dict[str, Any]]:
    """A CPU-only engine (gpus: 0) with spec.resources.memory sizes its pool within it
    (kv_cache.cpu_device_gib): the engine's own default (2 GiB) in a smaller container
    would be killed for its memory. spec.env or extraArgs --cpu-memory-gib win."""
    gib = None if spec.gpus else kv_cache.cpu_device_gib(spec.memory)
    flag = engine_settings.SETTINGS["cpu_memory_gib"]
    if gib is None or any(e.get("name") == flag.env for e in spec.env) or any(
            a == flag.flag or a.startswith(flag.flag + "=") for a in spec.engine.extra_args):
        return []
    return [{"name": flag.env, "value": f"{gib:.6g}"}]


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "privileged": False,
                      "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                      "capabilities": {"drop": ["ALL"]}}
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_UID,
                "fsGroup": ENGINE_UID, "seccompProfile": {"type": "RuntimeDefault"}}
# A pod leaving (a scale-down, a rollout) keeps accepting requests this long before SIGTERM:
# its endpoint turns not-ready at the deletion, and routers and kube-proxy stop sending to
# it meanwhile; then the server drains what is in flight (the engine's shutdown grace
# period, 30 s, and uvicorn's 5 s more; the router's 30 s) within the pod's grace period.
PRE_STOP_SECONDS = 5
PRE_STOP = {"preStop": {"exec": {"command": [   # python: every image that runs us has it
    "python", "-c", f"import time; time.sleep({PRE_STOP_SECONDS})"]}}}
ENGINE_GRACE_SECONDS = 60     # >= 5 + 30 + 5


def deployment(spec: ServiceSpec) -> dict[str, Any]:
    volumes, mounts = _volumes(spec)
    env = [{"name": "HF_HOME", "value": f"{MODEL_CACHE_DIR}/huggingface"},
           # builtin:// models are converted once into this cache (kept with spec.modelCache)
           {"name": "PAGED_MODEL_CACHE", "value": f"{MODEL_CACHE_DIR}/paged-inference"},
           {"name": "HOME", "value": "/tmp"},
           {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
           {"name": "TRITON_CACHE_DIR", "value": "/tmp/.triton"},
           *_cpu_threads_env(spec), *_cpu_memory_env(spec),
           *[dict(e) for e in spec.env]]
    container = {
        "name": "engine", "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "engine", "serve"], "args": engine_args(spec),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"},
                  *kv_events.container_ports(spec)],
        "env": env, "resources": _resources(spec), **_probes(spec), "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        # An engine that exits with an error leaves its last log lines in
        # lastState.terminated.message, where the status reads them.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "lifecycle": copy.deepcopy(PRE_STOP),
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # the engine never talks to the API server
        "terminationGracePeriodSeconds": ENGINE_GRACE_SECONDS,
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container], "volumes": volumes,
    }
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    rollout = spec.rollout
    strategy: dict[str, Any] = {"type": rollout.strategy}
    if rollout.strategy == "RollingUpdate":
        strategy["rollingUpdate"] = {"maxSurge": rollout.max_surge,
                                     "maxUnavailable": rollout.max_unavailable}
    body: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(spec.name)},
        "strategy": strategy,
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": rollout.startup_timeout_seconds + 600,
        "template": {"metadata": {"labels": labels(spec.name),
                                  "annotations": {CHECKSUM_ANNOTATION: config_checksum(spec)}},
                     "spec": pod_spec},
    }
    if spec.autoscaling is None:  # otherwise the autoscaler owns .spec.replicas
        body = {"replicas": spec.replicas, **body}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(spec, spec.name), "spec": body}


def router_selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "paged-inference-router",
            "app.kubernetes.io/instance": name}


def service(spec: ServiceSpec) -> dict[str, Any]:
    """The user-facing Service: the engine pods, or the router pods when spec.router is on."""
    selector = router_selector_labels(spec.name) if spec.router.enabled \
        else selector_labels(spec.name)
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec, spec.name),
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http",
                                "protocol": "TCP"}]}}


def pod_disruption_budget(spec: ServiceSpec) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(spec, spec.name),
            "spec": {"maxUnavailable": 1,
                     "selector": {"matchLabels": selector_labels(spec.name)}}}


def model_cache_claim(spec: ServiceSpec) -> dict[str, Any] | None:
    cache = spec.model_cache
    if cache is None or cache.size is None:  # none asked, or the user's own claim
        return None
    claim: dict[str, Any] = {"accessModes": list(cache.access_modes),
                             "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        claim["storageClassName"] = cache.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(spec, f"{spec.name}-model-cache"), "spec": claim}


def horizontal_pod_autoscaler(spec: ServiceSpec) -> dict[str, Any] | None:
    auto = spec.autoscaling
    if auto is None or auto.mode != "metrics":   # slo: the planner sets the replicas
        return None
    metric = {"type": "Pods", "pods": {
        "metric": {"name": AUTOSCALING_METRICS[auto.metric]},
        "target": {"type": "AverageValue", "averageValue": auto.target}}}
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": _meta(spec, spec.name),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": spec.name},
                     "minReplicas": auto.min_replicas, "maxReplicas": auto.max_replicas,
                     "metrics": [metric],
                     # Engine pods are slow to start: scale down only after 5 quiet minutes.
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}}}


def scaled_object(spec: ServiceSpec) -> dict[str, Any] | None:
    auto = spec.autoscaling
    if auto is None or auto.mode != "metrics":
        return None
    metric = AUTOSCALING_METRICS[auto.metric]
    # KEDA divides the sum by the replica count (AverageValue): a per-pod target.
    query = (f'sum({metric}{{namespace="{spec.namespace}",'
             f'model_name="{spec.model.served_name}"}})')
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": _meta(spec, spec.name),
            "spec": {"scaleTargetRef": {"name": spec.name},
                     "minReplicaCount": auto.min_replicas,
                     "maxReplicaCount": auto.max_replicas,
                     "triggers": [{"type": "prometheus", "metadata": {
                         "serverAddress": auto.prometheus_server_address,
                         "query": query, "threshold": auto.target}}]}}


def pod_monitor(spec: ServiceSpec) -> dict[str, Any]:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(spec, spec.name),
            "spec": {"selector": {"matchLabels": selector_labels(spec.name)},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics",
                                              "interval": "15s"}]}}
