"""What a PagedInferenceTuning becomes: the tuner Job and its identity.

- ServiceAccount `<tuning>-tuner`, a Role allowing exactly the Job's calls
  (tuner/incluster/cluster.py lists them) in the namespace, and the RoleBinding;
- the Job `<tuning>-tuner`: `python -m tuner tune --cluster --name <tuning>` in the
  engine image (it holds the tuner and the Locust workloads), restartPolicy Never and a
  backoffLimit, so a failed pod is replaced and the new one resumes from status.history.
  A target with spec.apiKeySecretRef has the same Secret key mounted as a file (as the
  engine has it; no Role rule on Secrets), named by $TUNER_API_KEY_FILE: the load sends it.
  spec.workloadFrom.trace.configMapRef is mounted the same way ($TUNER_TRACE_FILE; no Role
  rule on ConfigMaps beyond writing the recommendation); a trace URL the tuner fetches.
  spec.tunerPods N > 1 makes it an Indexed Job of N pods sharing spec.storage's study.
- spec.loadWorkers W > 1: Locust's distributed mode across pods. Per tuner pod i, a
  Service `<tuning>-load[-i]` in front of that pod's Locust master port (the pod's
  completion index selects it) and a Deployment of the same name with W load-worker pods
  (`python -m tuner load-worker`: a Locust worker in a loop, as every measurement is a new
  master; no API access). The Service is made before the Deployment, so the workers find
  the master in their `<SERVICE>_SERVICE_HOST` variables (or by DNS). The operator deletes
  both when the Job has finished.
All are owned by the tuning resource: deleting it deletes them (and its trial services).
"""
from __future__ import annotations

import copy
from typing import Any

from .manifests import API_KEY_FILE, CONTAINER_SECURITY, POD_SECURITY, SECRET_DIR
from paged_api.contract import (API_KEY_FILE_ENV, DEFAULT_WORKLOAD, GROUP, INDEX_LABEL, MANAGED_BY,
                       MASTER_PORT_ENV, SERVICE_PLURAL, STORAGE_URL_ENV, TRACE_FILE_ENV,
                       TUNING_PLURAL)
BACKOFF_LIMIT = 3
TRACE_DIR = "/etc/paged-inference/trace"
TRACE_FILE = f"{TRACE_DIR}/trace.jsonl"
MASTER_PORT = 5557              # Locust's default master port (tuner.measure.load_worker)
MASTER_PORT_NAME = "locust-master"
TRACE_WORKLOAD = "trace"        # the locustfile of every workloadFrom source


def tuner_name(name: str) -> str:
    return f"{name}-tuner"


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "paged-inference-tuner",
            "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "tuner",
            "app.kubernetes.io/managed-by": MANAGED_BY}


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": tuner_name(name), "namespace": namespace, "labels": labels(name)}


def service_account(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace),
            "automountServiceAccountToken": True}


def role(name: str, namespace: str) -> dict[str, Any]:
    """The tuning loop's calls, no more: read its own resource and write its status; make,
    read, patch (Auto's apply) and delete services (trials); find a trial's ready address;
    write the recommendation ConfigMap."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(name, namespace),
            "rules": [
                {"apiGroups": [GROUP], "resources": [TUNING_PLURAL],
                 "resourceNames": [name], "verbs": ["get"]},
                {"apiGroups": [GROUP], "resources": [f"{TUNING_PLURAL}/status"],
                 "resourceNames": [name], "verbs": ["patch"]},
                {"apiGroups": [GROUP], "resources": [SERVICE_PLURAL],
                 "verbs": ["get", "list", "create", "patch", "delete"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list"]},
                {"apiGroups": [""], "resources": ["configmaps"],
                 "verbs": ["create", "patch"]},
            ]}


def role_binding(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(name, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": tuner_name(name)},
            "subjects": [{"kind": "ServiceAccount", "name": tuner_name(name),
                          "namespace": namespace}]}


def _load_files(api_key: dict[str, str] | None) -> tuple[list[dict[str, Any]],
                                                          list[dict[str, Any]],
                                                          list[dict[str, Any]]]:
    """Volumes, mounts and env of a pod that sends load (the Job's, a load worker's): /tmp,
    and the target's API key as a file ($TUNER_API_KEY_FILE) when it has one. Optional: a
    missing Secret does not hold the pod in ContainerCreating; the tuner then fails the
    tuning with a message naming it."""
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    env: list[dict[str, Any]] = []
    if api_key:
        volumes.append({"name": "api-key", "secret": {
            "secretName": api_key["name"], "defaultMode": 0o440, "optional": True,
            "items": [{"key": api_key.get("key") or "api-key", "path": "api-key"}]}})
        mounts.append({"name": "api-key", "mountPath": SECRET_DIR, "readOnly": True})
        env.append({"name": API_KEY_FILE_ENV, "value": API_KEY_FILE})
    return volumes, mounts, env


def job(name: str, namespace: str, spec: dict[str, Any], *, image: str,
        api_key: dict[str, str] | None = None) -> dict[str, Any]:
    """`api_key`: the target's apiKeySecretRef ({name, key}), mounted for the load."""
    env: list[dict[str, Any]] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HOME", "value": "/tmp"}]
    secret = ((spec.get("storage") or {}).get("secretRef") or {})
    if secret.get("name"):
        env.append({"name": STORAGE_URL_ENV, "valueFrom": {"secretKeyRef": {
            "name": secret["name"], "key": secret.get("key") or "url"}}})
    volumes, mounts, key_env = _load_files(api_key)
    env += key_env
    trace_ref = (((spec.get("workloadFrom") or {}).get("trace") or {}).get("configMapRef")
                 or None)
    if trace_ref:
        # optional, as the key: a missing ConfigMap fails the tuning with its name
        volumes.append({"name": "trace", "configMap": {
            "name": trace_ref["name"], "optional": True,
            "items": [{"key": trace_ref.get("key") or "trace.jsonl", "path": "trace.jsonl"}]}})
        mounts.append({"name": "trace", "mountPath": TRACE_DIR, "readOnly": True})
        env.append({"name": TRACE_FILE_ENV, "value": TRACE_FILE})
    workers = int(spec.get("loadWorkers") or 1)
    ports: list[dict[str, Any]] = []
    if workers > 1:   # the Locust master listens for the load-worker pods
        env += [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": MASTER_PORT_ENV, "value": str(MASTER_PORT)}]
        ports.append({"name": MASTER_PORT_NAME, "containerPort": MASTER_PORT,
                      "protocol": "TCP"})
    container = {
        "name": "tuner", "image": spec.get("image") or image,
        "command": ["python", "-m", "tuner", "tune", "--cluster", "--name", name,
                    "--out-dir", "/tmp/tuner-out"],
        "env": env,
        # the tuner and the Locust master; the workers are pods of their own
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"},
                      "limits": {"memory": "2048Mi"}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        **({"ports": ports} if ports else {}),
    }
    pods = int(spec.get("tunerPods") or 1)
    # several pods: an Indexed Job, $JOB_COMPLETION_INDEX 0 confirms and applies
    indexed = {"completionMode": "Indexed", "completions": pods,
               "parallelism": pods} if pods > 1 else {}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, namespace),
            "spec": {"backoffLimit": BACKOFF_LIMIT, **indexed,
                     "template": {"metadata": {"labels": labels(name)}, "spec": {
                         "serviceAccountName": tuner_name(name),
                         "automountServiceAccountToken": True,
                         "restartPolicy": "Never",
                         "securityContext": copy.deepcopy(POD_SECURITY),
                         "containers": [container],
                         "volumes": volumes}}}}


def load_name(name: str, index: int, pods: int) -> str:
    return f"{name}-load" if pods == 1 else f"{name}-load-{index}"


def load_labels(name: str, index: int) -> dict[str, str]:
    return {"app.kubernetes.io/name": "paged-inference-load-worker",
            "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "load-worker",
            "app.kubernetes.io/managed-by": MANAGED_BY,
            f"{GROUP}/tuner-index": str(index)}


def load_services(name: str, namespace: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per tuner pod, the Service its load-worker pods reach its Locust master by."""
    pods = int(spec.get("tunerPods") or 1)
    out = []
    for i in range(pods):
        selector = {**labels(name), **({INDEX_LABEL: str(i)} if pods > 1 else {})}
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": load_name(name, i, pods), "namespace": namespace,
            "labels": load_labels(name, i)},
            "spec": {"selector": selector, "ports": [
                {"name": MASTER_PORT_NAME, "port": MASTER_PORT, "protocol": "TCP",
                 "targetPort": MASTER_PORT_NAME}]}})
    return out


def load_deployments(name: str, namespace: str, spec: dict[str, Any], *, image: str,
                     api_key: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per tuner pod, spec.loadWorkers Locust worker pods (tuner.measure.load_worker)."""
    pods, workers = int(spec.get("tunerPods") or 1), int(spec.get("loadWorkers") or 1)
    workload = TRACE_WORKLOAD if spec.get("workloadFrom") else (
        spec.get("workload") or DEFAULT_WORKLOAD)
    volumes, mounts, key_env = _load_files(api_key)   # the load sends the target's key
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}, *key_env]
    out = []
    for i in range(pods):
        service = load_name(name, i, pods)
        pod_labels = load_labels(name, i)
        out.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "name": service, "namespace": namespace, "labels": pod_labels},
            "spec": {"replicas": workers,
                     "selector": {"matchLabels": pod_labels},
                     "template": {"metadata": {"labels": pod_labels}, "spec": {
                         "automountServiceAccountToken": False,
                         "securityContext": copy.deepcopy(POD_SECURITY),
                         "containers": [{
                             "name": "load-worker", "image": spec.get("image") or image,
                             "command": ["python", "-m", "tuner", "load-worker",
                                         "--master-service", service,
                                         "--workload", workload],
                             "env": copy.deepcopy(env),
                             "resources": {"requests": {"cpu": "1", "memory": "256Mi"},
                                           "limits": {"memory": "1Gi"}},
                             "securityContext": copy.deepcopy(CONTAINER_SECURITY),
                             "volumeMounts": copy.deepcopy(mounts)}],
                         "volumes": copy.deepcopy(volumes)}}}})
    return out


def children(name: str, namespace: str, spec: dict[str, Any], *, image: str,
             api_key: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """In creation order: the identity before the Job that uses it; with load workers,
    their Services before their Deployments (for the Service variables) and the Job."""
    load: list[dict[str, Any]] = []
    if int(spec.get("loadWorkers") or 1) > 1:
        load = [*load_services(name, namespace, spec),
                *load_deployments(name, namespace, spec, image=image, api_key=api_key)]
    return [service_account(name, namespace), role(name, namespace),
            role_binding(name, namespace), *load,
            job(name, namespace, spec, image=image, api_key=api_key)]


