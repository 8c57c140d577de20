"""`kubectl get` output: the server renders a meta.k8s.io/v1 Table when asked (as=Table),
with a CRD's additionalPrinterColumns or a few built-in column sets."""
from __future__ import annotations

import datetime
import re
from typing import Any

from .kinds import Kind

_FILTER = re.compile(r'^(\w+)\[\?\(@\.(\w+)\s*==\s*["\']([^"\']*)["\']\)\]$')


def jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath printer columns use: `.a.b`, `.a[0]`, `.a[?(@.k=="v")].b`."""
    for part in [p for p in re.split(r"\.(?![^\[]*\])", path.strip().lstrip("$")) if p]:
        if m := _FILTER.match(part):
            field, key, value = m.groups()
            items = obj.get(field) if isinstance(obj, dict) else None
            obj = next((i for i in items or [] if isinstance(i, dict)
                        and str(i.get(key)) == value), None)
        elif m := re.match(r"^(\w+)\[(\d+)\]$", part):
            items = obj.get(m.group(1)) if isinstance(obj, dict) else None
            idx = int(m.group(2))
            obj = items[idx] if isinstance(items, list) and idx < len(items) else None
        else:
            obj = obj.get(part) if isinstance(obj, dict) else None
        if obj is None:
            return None
    return obj


def age(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
    secs = int((datetime.datetime.now(datetime.timezone.utc) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size * (2 if unit != "m" else 2):
            return f"{secs // size}{unit}"
    return f"{max(secs, 0)}s"


def _pod_row(o: dict[str, Any]) -> list[Any]:
    st = o.get("status", {})
    cs = st.get("containerStatuses") or []
    ready = f"{sum(1 for c in cs if c.get('ready'))}/{len(o['spec'].get('containers', []))}"
    reason = st.get("phase", "Pending")
    for c in cs:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting:
            reason = waiting.get("reason", reason)
    if o["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return [ready, reason, sum(c.get("restartCount", 0) for c in cs), st.get("podIP", "<none>")]


BUILTIN_COLUMNS: dict[str, tuple[list[str], Any]] = {
    "pods": (["Ready", "Status", "Restarts", "IP"], _pod_row),
    "deployments": (["Ready", "Up-to-date", "Available"], lambda o: [
        f"{o.get('status', {}).get('readyReplicas', 0)}/{o['spec'].get('replicas', 1)}",
        o.get("status", {}).get("updatedReplicas", 0),
        o.get("status", {}).get("availableReplicas", 0)]),
    "replicasets": (["Desired", "Current", "Ready"], lambda o: [
        o["spec"].get("replicas", 1), o.get("status", {}).get("replicas", 0),
        o.get("status", {}).get("readyReplicas", 0)]),
    "services": (["Type", "Cluster-IP", "Ports"], lambda o: [
        o["spec"].get("type", "ClusterIP"), o["spec"].get("clusterIP", ""),
        ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in o["spec"].get(
            "ports", []))]),
    "jobs": (["Status", "Completions"], lambda o: [
        "Complete" if o.get("status", {}).get("succeeded") else
        "Failed" if o.get("status", {}).get("failed") else "Running",
        f"{o.get('status', {}).get('succeeded', 0)}/{o['spec'].get('completions', 1)}"]),
}


def table(kind: Kind, objects: list[dict[str, Any]], resource_version: str,
          include_object: str = "Metadata") -> dict[str, Any]:
    names = ["Name"]
    if kind.printer_columns:
        cols = [c for c in kind.printer_columns if c["jsonPath"] != ".metadata.creationTimestamp"]
        names += [c["name"] for c in cols]
        row_of = lambda o: [jsonpath(o, c["jsonPath"]) for c in cols]  # noqa: E731
    else:
        extra, row_of = BUILTIN_COLUMNS.get(kind.plural, ([], lambda o: []))
        names += extra
    names.append("Age")
    rows = []
    for o in objects:
        partial = o if include_object == "Object" else {
            "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": o["metadata"]}
        cells = [o["metadata"]["name"], *row_of(o), age(o["metadata"].get("creationTimestamp"))]
        rows.append({"cells": ["<none>" if c is None else c for c in cells], "object": partial})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": [{"name": n, "type": "string", "format": "name" if n == "Name"
                                   else "", "description": "", "priority": 0} for n in names],
            "rows": rows}
