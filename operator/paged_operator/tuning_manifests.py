"""What a PagedInferenceTuning becomes: the tuner Job and its identity.

- ServiceAccount `<tuning>-tuner`, a Role allowing exactly the Job's calls
  (tuner/cluster_kube.py lists them) in the namespace, and the RoleBinding;
- the Job `<tuning>-tuner`: `python -m tuner tune --cluster --name <tuning>` in the
  engine image (it holds the tuner and the Locust workloads), restartPolicy Never and a
  backoffLimit, so a failed pod is replaced and the new one resumes from status.history.
  A target with spec.apiKeySecretRef has the same Secret key mounted as a file (as the
  engine has it; no Role rule on Secrets), named by $TUNER_API_KEY_FILE: the load sends it.
All are owned by the tuning resource: deleting it deletes them (and its trial services).
"""
from __future__ import annotations

import copy
from typing import Any

from .manifests import API_KEY_FILE, CONTAINER_SECURITY, POD_SECURITY, SECRET_DIR
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


def job(name: str, namespace: str, spec: dict[str, Any], *, image: str,
        api_key: dict[str, str] | None = None) -> dict[str, Any]:
    """`api_key`: the target's apiKeySecretRef ({name, key}), mounted for the load."""
    env: list[dict[str, Any]] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HOME", "value": "/tmp"}]
    secret = ((spec.get("storage") or {}).get("secretRef") or {})
    if secret.get("name"):
        env.append({"name": "TUNER_STORAGE_URL", "valueFrom": {"secretKeyRef": {
            "name": secret["name"], "key": secret.get("key") or "url"}}})
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    if api_key:
        # optional: a missing Secret does not hold the pod in ContainerCreating; the tuner
        # then fails the tuning with a message naming it
        volumes.append({"name": "api-key", "secret": {
            "secretName": api_key["name"], "defaultMode": 0o440, "optional": True,
            "items": [{"key": api_key.get("key") or "api-key", "path": "api-key"}]}})
        mounts.append({"name": "api-key", "mountPath": SECRET_DIR, "readOnly": True})
        env.append({"name": "TUNER_API_KEY_FILE", "value": API_KEY_FILE})
    container = {
        "name": "tuner", "image": spec.get("image") or image,
        "command": ["python", "-m", "tuner", "tune", "--cluster", "--name", name,
                    "--out-dir", "/tmp/tuner-out"],
        "env": env,
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"},
                      "limits": {"memory": "2Gi"}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, namespace),
            "spec": {"backoffLimit": BACKOFF_LIMIT,
                     "template": {"metadata": {"labels": labels(name)}, "spec": {
                         "serviceAccountName": tuner_name(name),
                         "automountServiceAccountToken": True,
                         "restartPolicy": "Never",
                         "securityContext": copy.deepcopy(POD_SECURITY),
                         "containers": [container],
                         "volumes": volumes}}}}


def children(name: str, namespace: str, spec: dict[str, Any], *, image: str,
             api_key: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """In creation order: the identity before the Job that uses it."""
    return [service_account(name, namespace), role(name, namespace),
            role_binding(name, namespace),
            job(name, namespace, spec, image=image, api_key=api_key)]


API_VERSION = f"{GROUP}/{VERSION}"
