"""The SLO planner's children (spec.autoscaling.mode: slo): its Deployment and identity.

The planner runs as a Deployment the operator owns, not inside the operator: it imports
the simulator (the engine's own scheduler and the step-time profile), which the engine
image holds and the operator's image does not, a simulated capacity search takes seconds
of CPU that would stall every other resource's handlers, and a planner that fails takes
only its own service's scaling down with it. One replica per service (a second would
race the first on the scale subresource); its Role allows exactly the calls of
tuner/planner/run.py.
"""
from __future__ import annotations

import copy
from typing import Any

from paged_api.contract import GROUP, MANAGED_BY, SERVICE_PLURAL
from .manifests import CONTAINER_SECURITY, POD_SECURITY
from paged_api.service import ServiceSpec


METRICS_PORT = 9090   # the planner's /metrics: paged_planner_* (tuner/planner/metrics.py)


def planner_name(spec: ServiceSpec) -> str:
    return f"{spec.name}-planner"


def planner_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "paged-inference-planner",
            "app.kubernetes.io/instance": name, "app.kubernetes.io/component": "planner",
            "app.kubernetes.io/managed-by": MANAGED_BY}


def _meta(spec: ServiceSpec) -> dict[str, Any]:
    return {"name": planner_name(spec), "namespace": spec.namespace,
            "labels": planner_labels(spec.name)}


def planner_role(spec: ServiceSpec) -> dict[str, Any]:
    group = GROUP
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(spec),
            "rules": [
                {"apiGroups": [group], "resources": [SERVICE_PLURAL],
                 "resourceNames": [spec.name], "verbs": ["get"]},
                {"apiGroups": [group], "resources": [f"{SERVICE_PLURAL}/status"],
                 "resourceNames": [spec.name], "verbs": ["get", "patch"]},
                {"apiGroups": ["apps"], "resources": ["deployments/scale"],
                 "resourceNames": [spec.name], "verbs": ["get", "patch", "update"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                # every router pod's held requests, at zero replicas
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list"]}]}


def planner_children(spec: ServiceSpec) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding, Deployment; [] unless autoscaling.mode is slo."""
    auto = spec.autoscaling
    if auto is None or auto.mode != "slo":
        return []
    name = planner_name(spec)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec),
               "automountServiceAccountToken": True}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": _meta(spec),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name,
                             "namespace": spec.namespace}]}
    container = {
        "name": "planner", "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "tuner", "plan", "--name", spec.name,
                    "--metrics-port", str(METRICS_PORT)],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "env": [{"name": "POD_NAMESPACE",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "HOME", "value": "/tmp"}],
        # the simulator's capacity search: one core's worth, its tokenizer and traces
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                      "limits": {"memory": "2Gi"}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name, "automountServiceAccountToken": True,
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container], "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    selector = {k: v for k, v in planner_labels(spec.name).items()
                if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(spec),
                  "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                           "selector": {"matchLabels": selector},
                           "template": {"metadata": {"labels": planner_labels(spec.name)},
                                        "spec": pod_spec}}}
    return [account, planner_role(spec), binding, deployment]


def planner_pod_monitor(spec: ServiceSpec) -> dict[str, Any] | None:
    """The planner pod's /metrics for the Prometheus Operator (the dashboard's planner
    row), beside the engines' PodMonitor; None unless autoscaling.mode is slo."""
    auto = spec.autoscaling
    if auto is None or auto.mode != "slo":
        return None
    selector = {k: v for k, v in planner_labels(spec.name).items()
                if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(spec),
            "spec": {"selector": {"matchLabels": selector},
                     "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics",
                                              "interval": "15s"}]}}
