"""What a PagedInferenceTuning becomes: the tuner Job and its identity.

- ServiceAccount `<tuning>-tuner`, a Role allowing exactly the Job's calls
  (tuner/cluster_kube.py lists them) in the namespace, and the RoleBinding;
- the Job `<tuning>-tuner`: `python -m tuner tune --cluster --name <tuning>` in the
  engine image (it holds the tuner and the Locust workloads), restartPolicy Never and a
  backoffLimit, so a failed pod is replaced and the new one resumes from status.history.
All are owned by the tuning resource: deleting it deletes them (and its trial services).
"""
from __future__ import annotations

import copy
from typing import Any

from .manifests import CONTAINER_SECURITY, POD_SECURITY
from .spec import GROUP, VERSION

TUNING_KIND = "PagedInferenceTuning"
TUNING_PLURAL = "pagedinferencetunings"
MANAGED_BY = "paged-inference-operator"
BACKOFF_LIMIT = 3


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
                {"apiGroups": [GROUP], "resources": ["pagedinferenceservices"],
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


def job(name: str, namespace: str, spec: dict[str, Any], *, image: str) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HOME", "value": "/tmp"}]
    secret = ((spec.get("storage") or {}).get("secretRef") or {})
    if secret.get("name"):
        env.append({"name": "TUNER_STORAGE_URL", "valueFrom": {"secretKeyRef": {
            "name": secret["name"], "key": secret.get("key") or "url"}}})
    container = {
        "name": "tuner", "image": spec.get("image") or image,
        "command": ["python", "-m", "tuner", "tune", "--cluster", "--name", name,
                    "--out-dir", "/tmp/tuner-out"],
        "env": env,
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"},
                      "limits": {"memory": "2Gi"}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, namespace),
            "spec": {"backoffLimit": BACKOFF_LIMIT,
                     "template": {"metadata": {"labels": labels(name)}, "spec": {
                         "serviceAccountName": tuner_name(name),
                         "automountServiceAccountToken": True,
                         "restartPolicy": "Never",
                         "securityContext": copy.deepcopy(POD_SECURITY),
                         "containers": [container],
                         "volumes": [{"name": "tmp", "emptyDir": {}}]}}}}


def children(name: str, namespace: str, spec: dict[str, Any], *,
             image: str) -> list[dict[str, Any]]:
    """In creation order: the identity before the Job that uses it."""
    return [service_account(name, namespace), role(name, namespace),
            role_binding(name, namespace), job(name, namespace, spec, image=image)]


API_VERSION = f"{GROUP}/{VERSION}"
