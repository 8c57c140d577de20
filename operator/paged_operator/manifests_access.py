"""Children that control who reaches the engine: the NetworkPolicy and, with spec.router,
the router's Deployment, its identity (ServiceAccount, a Role that reads EndpointSlices
only, the RoleBinding) and the headless Service of the engine pods it discovers.

With the router on, the user-facing Service `<name>` selects the router pods
(manifests.service) and the engine pods are reached through `<name>-engine`.
"""
from __future__ import annotations

import copy
from typing import Any

from . import kv_events, manifests
from .manifests import (CONTAINER_SECURITY, MANAGED_BY, POD_SECURITY, router_selector_labels,
                        selector_labels)
from paged_api.service import ENGINE_PORT, ServiceSpec

ROUTER_PORT = ENGINE_PORT


def engine_service_name(spec: ServiceSpec) -> str:
    return f"{spec.name}-engine"


def router_name(spec: ServiceSpec) -> str:
    return f"{spec.name}-router"


def router_labels(name: str) -> dict[str, str]:
    return {**router_selector_labels(name), "app.kubernetes.io/component": "router",
            "app.kubernetes.io/managed-by": MANAGED_BY}


def _meta(spec: ServiceSpec, name: str, *, router: bool = False) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace,
            "labels": router_labels(spec.name) if router else manifests.labels(spec.name)}


def network_policy(spec: ServiceSpec) -> dict[str, Any] | None:
    """Ingress to the engine (and router) pods only from pods of the same namespace (the
    router among them) and the peers in spec.networkPolicy.allowFrom (e.g. a Prometheus
    namespace). Egress stays open: engines download weights."""
    if not spec.network_policy.enabled:
        return None
    peers = [{"podSelector": {}}, *[copy.deepcopy(dict(p))
                                    for p in spec.network_policy.allow_from]]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(spec, spec.name),
            "spec": {"podSelector": {"matchLabels": {
                "app.kubernetes.io/instance": spec.name,
                "app.kubernetes.io/managed-by": MANAGED_BY}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": peers,
                             "ports": [{"protocol": "TCP", "port": ENGINE_PORT}]}]}}


def kv_events_network_policy(spec: ServiceSpec) -> dict[str, Any] | None:
    """With the precise policy (kv_events.py): the engine pods' event ports, from this
    resource's router pods only. None without it, or with network policies off (nothing is
    restricted then, and a policy selecting the engine pods would isolate them)."""
    if not kv_events.enabled(spec) or not spec.network_policy.enabled:
        return None
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(spec, kv_events.policy_name(spec)),
            "spec": {"podSelector": {"matchLabels": selector_labels(spec.name)},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {
                                     "matchLabels": router_selector_labels(spec.name)}}],
                                  "ports": [{"protocol": "TCP", "port": name} for name in
                                            (kv_events.PUB_PORT_NAME,
                                             kv_events.REPLAY_PORT_NAME)]}]}}


def engine_service(spec: ServiceSpec) -> dict[str, Any]:
    """Headless: the router watches its EndpointSlices and talks to each pod directly (and,
    with the precise policy, finds each pod's KV-event ports in them)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(spec, engine_service_name(spec)),
            "spec": {"clusterIP": "None", "selector": selector_labels(spec.name),
                     "publishNotReadyAddresses": False,
                     "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http",
                                "protocol": "TCP"}, *kv_events.service_ports(spec)]}}


def router_service_account(spec: ServiceSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _meta(spec, router_name(spec), router=True),
            "automountServiceAccountToken": True}


def router_role(spec: ServiceSpec) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(spec, router_name(spec), router=True),
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                       "verbs": ["get", "list", "watch"]}]}


def router_role_binding(spec: ServiceSpec) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(spec, router_name(spec), router=True),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": router_name(spec)},
            "subjects": [{"kind": "ServiceAccount", "name": router_name(spec),
                          "namespace": spec.namespace}]}


def cold_start_args(spec: ServiceSpec) -> list[str]:
    """A service the SLO planner may scale to zero: the router holds requests while the
    first replica starts (up to its startup timeout, at most 10 minutes: clients give up
    sooner), and the planner sees them held."""
    auto = spec.autoscaling
    if auto is None or auto.mode != "slo" or auto.min_replicas > 0:
        return []
    return ["--cold-start-hold", str(min(600, spec.rollout.startup_timeout_seconds))]


def router_args(spec: ServiceSpec) -> list[str]:
    # No API key here: the router forwards the client's Authorization header and the
    # engines (spec.apiKeySecretRef) check it; `python -m paged_router` takes its key only
    # as --api-key / $VLLM_API_KEY today, and a key never goes into argv or env.
    hit = spec.router.hit_load_factor
    return ["--discover", engine_service_name(spec), "--policy", spec.router.policy,
            *(["--hit-load-factor", format(hit, "g")] if hit is not None else []),
            *cold_start_args(spec),
            "--port-name", "http",  # the slices also carry the engines' event ports
            "--host", "0.0.0.0", "--port", str(ROUTER_PORT)]


ROUTER_GRACE_SECONDS = 40


def router_deployment(spec: ServiceSpec) -> dict[str, Any]:
    def probe(**kw: int) -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5, **kw}
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    container = {
        "name": "router", "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "paged_router"], "args": router_args(spec),
        "env": [{"name": "POD_NAMESPACE",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "HOME", "value": "/tmp"}],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"memory": "512Mi"}},
        "readinessProbe": probe(periodSeconds=5, failureThreshold=3),
        "livenessProbe": probe(periodSeconds=10, failureThreshold=6),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        "lifecycle": copy.deepcopy(manifests.PRE_STOP),
    }
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": ROUTER_GRACE_SECONDS,   # >= 5 + the router's 30
        "serviceAccountName": router_name(spec),
        "automountServiceAccountToken": True,  # it reads EndpointSlices, nothing else
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container], "volumes": volumes,
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(spec, router_name(spec), router=True),
            "spec": {"replicas": spec.router.replicas,
                     "selector": {"matchLabels": router_selector_labels(spec.name)},
                     "template": {"metadata": {"labels": router_labels(spec.name)},
                                  "spec": pod_spec}}}


def router_children(spec: ServiceSpec) -> list[dict[str, Any]]:
    """The router's objects, in the order they must be created; [] with the router off."""
    if not spec.router.enabled:
        return []
    return [router_service_account(spec), router_role(spec), router_role_binding(spec),
            engine_service(spec), router_deployment(spec)]
