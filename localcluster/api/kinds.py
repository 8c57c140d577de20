"""The resource catalog the emulated API server serves, and its discovery documents.

Built-in kinds are declared here; CustomResourceDefinitions add theirs when they are created
(and report Established). Discovery is the legacy, non-aggregated form: kubectl 1.35 asks
for aggregated discovery first and falls back when the answer is plain JSON.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    printer_columns: tuple[dict[str, Any], ...] = ()   # a CRD's additionalPrinterColumns
    scale_paths: tuple[str, str, str] = (".spec.replicas", ".status.replicas", "")
    # a CRD version's openAPIV3Schema: custom resources are admitted against it
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Objects are stored per (group, plural), whichever version they were written in."""
        return (self.group, self.plural)


def _k(gv: str, plural: str, kind: str, *short: str, cluster: bool = False,
       sub: tuple[str, ...] = ("status",), cat: tuple[str, ...] = ()) -> Kind:
    group, _, version = gv.rpartition("/")
    return Kind(group, version, plural, kind, not cluster, short, sub, cat)


BUILTIN: list[Kind] = [
    _k("v1", "pods", "Pod", "po", sub=("status", "log"), cat=("all",)),
    _k("v1", "services", "Service", "svc", cat=("all",)),
    _k("v1", "configmaps", "ConfigMap", "cm", sub=()),
    _k("v1", "secrets", "Secret", sub=()),
    _k("v1", "serviceaccounts", "ServiceAccount", "sa", sub=()),
    _k("v1", "events", "Event", "ev", sub=()),
    _k("v1", "endpoints", "Endpoints", "ep", sub=()),
    _k("v1", "persistentvolumeclaims", "PersistentVolumeClaim", "pvc"),
    _k("v1", "namespaces", "Namespace", "ns", cluster=True),
    _k("v1", "nodes", "Node", "no", cluster=True),
    _k("apps/v1", "deployments", "Deployment", "deploy", sub=("status", "scale"), cat=("all",)),
    _k("apps/v1", "replicasets", "ReplicaSet", "rs", sub=("status", "scale"), cat=("all",)),
    _k("batch/v1", "jobs", "Job", sub=("status",), cat=("all",)),
    _k("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", sub=()),
    _k("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", "pdb"),
    _k("autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", "hpa",
       cat=("all",)),
    _k("coordination.k8s.io/v1", "leases", "Lease", sub=()),
    _k("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", "netpol", sub=()),
    _k("rbac.authorization.k8s.io/v1", "roles", "Role", sub=()),
    _k("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", sub=()),
    _k("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", sub=(), cluster=True),
    _k("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", sub=(),
       cluster=True),
    _k("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition",
       "crd", "crds", cluster=True),
    # The Prometheus operator's kind, as if kube-prometheus-stack were installed: the process
    # kubelet turns PodMonitors into Prometheus targets.
    _k("monitoring.coreos.com/v1", "podmonitors", "PodMonitor", "pmon", sub=()),
]


def kinds_of_crd(crd: dict[str, Any]) -> list[Kind]:
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    out = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        sub = tuple(version.get("subresources", {}) or {})
        scale = (version.get("subresources") or {}).get("scale") or {}
        out.append(Kind(spec["group"], version["name"], names["plural"], names["kind"],
                        spec.get("scope", "Namespaced") == "Namespaced",
                        tuple(names.get("shortNames", [])), sub,
                        tuple(names.get("categories", [])),
                        tuple(version.get("additionalPrinterColumns", [])),
                        (scale.get("specReplicasPath", ".spec.replicas"),
                         scale.get("statusReplicasPath", ".status.replicas"),
                         scale.get("labelSelectorPath", "")),
                        (version.get("schema") or {}).get("openAPIV3Schema")))
    return out


def crd_accepted_status(crd: dict[str, Any], now: str) -> dict[str, Any]:
    cond = [{"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now}
            for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                            ("Established", "InitialNamesAccepted",
                             "the initial names have been accepted"))]
    return {"conditions": cond, "acceptedNames": crd.get("spec", {}).get("names", {}),
            "storedVersions": [v["name"] for v in crd.get("spec", {}).get("versions", [])
                               if v.get("storage")]}


@dataclass
class Catalog:
    kinds: list[Kind] = field(default_factory=lambda: list(BUILTIN))

    def add(self, new: list[Kind]) -> None:
        names = {(k.group, k.version, k.plural) for k in new}
        self.kinds = [k for k in self.kinds if (k.group, k.version, k.plural) not in names] + new

    def remove_group_plural(self, group: str, plural: str) -> None:
        self.kinds = [k for k in self.kinds if (k.group, k.plural) != (group, plural)]

    def find(self, group: str, version: str, plural: str) -> Kind | None:
        for k in self.kinds:
            if (k.group, k.version, k.plural) == (group, version, plural):
                return k
        return None

    def by_kind(self, api_version: str, kind: str) -> Kind | None:
        for k in self.kinds:
            if k.api_version == api_version and k.kind == kind:
                return k
        return None

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for k in self.kinds:
            if k.group and k.version not in out.setdefault(k.group, []):
                out[k.group].append(k.version)
        return out

    def api_group_list(self) -> dict[str, Any]:
        groups = []
        for group, versions in self.groups().items():
            vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
            groups.append({"name": group, "versions": vs, "preferredVersion": vs[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def api_group(self, group: str) -> dict[str, Any] | None:
        doc = next((g for g in self.api_group_list()["groups"] if g["name"] == group), None)
        return None if doc is None else {"kind": "APIGroup", "apiVersion": "v1", **doc}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        kinds = [k for k in self.kinds if (k.group, k.version) == (group, version)]
        if not kinds:
            return None
        resources = []
        for k in kinds:
            resources.append({"name": k.plural, "singularName": k.singular,
                              "namespaced": k.namespaced, "kind": k.kind, "verbs": VERBS,
                              **({"shortNames": list(k.short_names)} if k.short_names else {}),
                              **({"categories": list(k.categories)} if k.categories else {})})
            for sub in k.subresources:
                sub_kind = "Scale" if sub == "scale" else k.kind
                verbs = ["get"] if sub == "log" else ["get", "patch", "update"]
                resources.append({"name": f"{k.plural}/{sub}", "singularName": "",
                                  "namespaced": k.namespaced, "kind": sub_kind, "verbs": verbs,
                                  **({"group": "autoscaling", "version": "v1"}
                                     if sub == "scale" else {})})
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                "resources": resources}


def replace(kind: Kind, **changes: Any) -> Kind:
    return dataclasses.replace(kind, **changes)
