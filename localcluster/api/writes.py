"""Write semantics of the emulated API server: defaults a real API server fills in, the
status and scale subresources, PUT with optimistic concurrency, and the PATCH flavours.
Errors are raised as ApiError with the HTTP status and reason a real server answers."""
from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import itertools
from typing import Any

import yaml

from . import admission, cel
from . import patch as patching
from .kinds import Kind, crd_accepted_status
from .store import Store, now


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def admit(kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None,
          field_validation: str, warnings: list[str] | None) -> dict[str, Any]:
    """A custom resource through its CRD's schema (pruned, defaulted, validated); a CRD's
    CEL rules must compile. Other objects pass as they are."""
    if kind.plural == "customresourcedefinitions" and kind.group == "apiextensions.k8s.io":
        causes = []
        for i, version in enumerate((obj.get("spec") or {}).get("versions") or []):
            schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
            causes += cel.compile_errors(
                schema, f"spec.validation.openAPIV3Schema[{i}]")
        if causes:
            name = (obj.get("metadata") or {}).get("name", "")
            text = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
            raise ApiError(422, "Invalid", f'CustomResourceDefinition.apiextensions.k8s.io '
                           f'"{name}" is invalid: {text}', {
                               "name": name, "group": "apiextensions.k8s.io",
                               "kind": "CustomResourceDefinition", "causes": causes})
        return obj
    if kind.schema is None:
        return obj
    try:
        done = admission.admit(kind.schema, kind.kind, kind.group, kind.version, obj, old,
                               field_validation)
    except admission.Invalid as e:
        raise ApiError(e.code, e.reason, e.message, e.details) from None
    if warnings is not None:
        warnings += done.warnings
    return done.obj


_cluster_ips = (str(ipaddress.ip_address("10.96.0.10") + i) for i in itertools.count())


def defaults(kind: Kind, obj: dict[str, Any]) -> None:
    """Fill what the API server's defaulting would, for the fields our components read."""
    spec = obj.setdefault("spec", {}) if kind.schema is None and kind.plural not in (
        "configmaps", "secrets", "events", "endpoints", "serviceaccounts", "leases",
        "roles", "rolebindings", "clusterroles", "clusterrolebindings", "endpointslices") \
        else None
    if kind.plural in ("deployments", "replicasets") and spec is not None:
        spec.setdefault("replicas", 1)
    if kind.plural == "deployments" and spec is not None:
        if not (spec.get("strategy") or {}).get("type"):   # also `strategy: {}`
            spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {
                "maxSurge": "25%", "maxUnavailable": "25%"}}
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
    if kind.plural == "jobs" and spec is not None:
        spec.setdefault("completions", 1)
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
    if kind.plural == "services" and spec is not None and not spec.get("clusterIP"):
        spec["clusterIP"] = next(_cluster_ips)
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("type", "ClusterIP")
        for port in spec.get("ports", []):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    if kind.plural == "pods" and spec is not None:
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("restartPolicy", "Always")
        obj.setdefault("status", {"phase": "Pending"})
    if kind.plural == "namespaces":
        obj["status"] = {"phase": "Active"}
    if kind.plural == "customresourcedefinitions":
        obj["status"] = crd_accepted_status(obj, now())


def normalize(kind: Kind, obj: dict[str, Any]) -> None:
    """What the API server does to every write of some kinds: a Secret's `stringData` is
    merged into `data` (base64) and never stored; `data` must be base64."""
    if kind.plural != "secrets" or kind.group:
        return
    data = obj.get("data") or {}
    if not isinstance(data, dict) or not isinstance(obj.get("stringData") or {}, dict):
        raise ApiError(400, "BadRequest", "a Secret's data and stringData must be maps")
    for key, value in (obj.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(422, "Invalid", f"Secret data[{key!r}] is not base64: put "
                           "plain text under stringData, or base64-encode it") from None
    if data:
        obj["data"] = data
    obj.setdefault("type", "Opaque")


def check_namespace(kind: Kind, url_ns: str | None, body: dict[str, Any]) -> None:
    body_ns = (body.get("metadata") or {}).get("namespace")
    if kind.namespaced and url_ns and body_ns and body_ns != url_ns:
        raise ApiError(400, "BadRequest", "the namespace of the provided object does not "
                       "match the namespace sent on the request")


def create(store: Store, kind: Kind, namespace: str | None, body: Any,
           field_validation: str = "Ignore", warnings: list[str] | None = None
           ) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the request body must be a JSON object")
    check_namespace(kind, namespace, body)
    body = copy.deepcopy(body)
    defaults(kind, body)
    normalize(kind, body)
    body = admit(kind, body, None, field_validation, warnings)
    try:
        return store.create(kind, namespace, body)
    except FileExistsError as e:
        raise ApiError(409, "AlreadyExists", str(e)) from None
    except ValueError as e:
        raise ApiError(422, "Invalid", str(e)) from None


def _current(store: Store, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
    obj = store.get(kind, namespace, name)
    if obj is None:
        raise ApiError(404, "NotFound",
                       f'{kind.plural}.{kind.group or "core"} "{name}" not found'.replace(
                           ".core", ""))
    return obj


def _path_set(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    for p in parts[:-1]:
        obj = obj.setdefault(p, {})
    obj[parts[-1]] = value


def _path_get(obj: Any, path: str) -> Any:
    for p in [p for p in path.split(".") if p]:
        obj = obj.get(p) if isinstance(obj, dict) else None
    return obj


def scale_of(kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
    spec_path, status_path, selector_path = kind.scale_paths
    if selector_path:
        selector = _path_get(obj, selector_path) or ""
    else:
        labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    meta = obj["metadata"]
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "creationTimestamp") if k in meta},
            "spec": {"replicas": _path_get(obj, spec_path) or 0},
            "status": {"replicas": _path_get(obj, status_path) or 0, "selector": selector}}


def _finish(store: Store, kind: Kind, old: dict[str, Any], new: dict[str, Any],
            subresource: str | None, field_validation: str = "Ignore",
            warnings: list[str] | None = None) -> dict[str, Any]:
    """Keep the parts a write to this endpoint may not change, then store."""
    if not isinstance(new, dict):
        raise ApiError(400, "BadRequest", "the result of the write is not an object")
    if subresource == "status":
        result = copy.deepcopy(old)
        result["status"] = new.get("status", old.get("status"))
        new = result
    elif subresource == "scale":
        result = copy.deepcopy(old)
        replicas = (new.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", "spec.replicas of a Scale must be an integer >= 0")
        _path_set(result, kind.scale_paths[0], replicas)
        result = admit(kind, result, old, field_validation, warnings)
        return scale_of(kind, store.update(kind, result))
    elif subresource is None and "status" in kind.subresources:
        new = dict(new)
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    elif subresource is not None:
        raise ApiError(404, "NotFound", f"{kind.plural} has no subresource {subresource!r}")
    new.setdefault("metadata", {})
    normalize(kind, new)
    new = admit(kind, new, old, field_validation, warnings)
    stored = store.update(kind, new)
    return stored


def replace(store: Store, kind: Kind, namespace: str | None, name: str, body: Any,
            subresource: str | None, field_validation: str = "Ignore",
            warnings: list[str] | None = None) -> dict[str, Any]:
    old = _current(store, kind, namespace, name)
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the request body must be a JSON object")
    wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
    if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
        raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural} '
                       f'"{name}": the object has been modified; please apply your changes '
                       "to the latest version and try again")
    if subresource == "scale":
        return _finish(store, kind, old, body, "scale")
    check_namespace(kind, namespace, body)
    new = copy.deepcopy(body)
    meta = new.setdefault("metadata", {})
    if meta.get("name", name) != name:
        raise ApiError(400, "BadRequest", f'the name of the object ({meta["name"]}) does not '
                       f"match the name on the URL ({name})")
    meta["name"] = name   # the URL's name and namespace, when the body leaves them out
    if kind.namespaced:
        meta["namespace"] = old["metadata"]["namespace"]
    meta.setdefault("resourceVersion", old["metadata"]["resourceVersion"])
    return _finish(store, kind, old, new, subresource, field_validation, warnings)


def apply_patch(store: Store, kind: Kind, namespace: str | None, name: str, raw: bytes,
                content_type: str, subresource: str | None, field_validation: str = "Ignore",
                warnings: list[str] | None = None) -> dict[str, Any]:
    try:
        body = yaml.safe_load(raw.decode() or "{}")   # YAML is a superset of JSON
    except yaml.YAMLError as e:
        raise ApiError(400, "BadRequest", f"the patch is not JSON or YAML: {e}") from None
    old = store.get(kind, namespace, name)
    if old is None and content_type.startswith("application/apply-patch"):
        return create(store, kind, namespace, body, field_validation, warnings)   # SSA creates
    old = _current(store, kind, namespace, name)
    base = scale_of(kind, old) if subresource == "scale" else old
    try:
        if content_type.startswith("application/json-patch+json"):
            new = patching.json_patch(base, body)
        elif content_type.startswith("application/strategic-merge-patch+json"):
            if kind.group not in ("", "apps", "batch", "policy", "autoscaling",
                                  "discovery.k8s.io", "rbac.authorization.k8s.io",
                                  "coordination.k8s.io"):
                raise ApiError(415, "UnsupportedMediaType", "strategic merge patch is not "
                               "supported for custom resources: use a merge patch")
            new = patching.strategic_merge(base, body)
        else:   # merge-patch+json, and apply-patch (treated as a merge: no field ownership)
            new = patching.merge_patch(base, body)
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ApiError(422, "Invalid", f"the patch cannot be applied: {e}") from None
    wanted_rv = ((new or {}).get("metadata") or {}).get("resourceVersion")
    if subresource != "scale" and wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
        raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural} '
                       f'"{name}": the object has been modified')
    return _finish(store, kind, old, new, subresource, field_validation, warnings)


def delete(store: Store, kind: Kind, namespace: str | None, name: str,
           options: dict[str, Any]) -> dict[str, Any]:
    _current(store, kind, namespace, name)
    grace = options.get("gracePeriodSeconds")
    return store.delete(kind, namespace, name, grace if isinstance(grace, int) else None)
