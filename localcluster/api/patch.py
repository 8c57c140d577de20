"""PATCH bodies as the API server applies them: JSON merge patch (RFC 7386), JSON patch
(RFC 6902) and the strategic merge patch kubectl sends for built-in kinds.

The strategic merge here knows the list merge keys of the fields our manifests use (and
kubectl's `$setElementOrder`, `$patch`, `$retainKeys`, `$deleteFromPrimitiveList` directives);
other lists are replaced, as a merge patch would.
"""
from __future__ import annotations

import copy
from typing import Any

# field name -> the key its list elements are merged on (from the Kubernetes API types)
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "imagePullSecrets": "name",
    "conditions": "type", "ownerReferences": "uid", "hostAliases": "ip",
    "volumeDevices": "devicePath", "topologySpreadConstraints": "topologyKey",
}
PORT_KEYS = ("containerPort", "port")   # container ports merge on containerPort, Service ports on port


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        return next((k for k in PORT_KEYS if items and all(
            isinstance(i, dict) and k in i for i in items)), None)
    return MERGE_KEYS.get(field)


def _merge_list(field: str, base: list[Any], patch: list[Any], order: list[Any] | None) -> list:
    key = _merge_key(field, [p for p in patch if isinstance(p, dict)] or base)
    if key is None or not all(isinstance(p, dict) for p in patch):
        return copy.deepcopy(patch)
    out = {item.get(key): copy.deepcopy(item) for item in base if isinstance(item, dict)}
    for item in patch:
        if item.get("$patch") == "delete":
            out.pop(item.get(key), None)
        elif item.get("$patch") == "replace":
            out[item.get(key)] = {k: v for k, v in item.items() if k != "$patch"}
        else:
            out[item.get(key)] = strategic_merge(out.get(item.get(key), {}), item)
    if order is not None:
        ranks = {o.get(key): i for i, o in enumerate(order) if isinstance(o, dict)}
        return sorted(out.values(), key=lambda o: ranks.get(o.get(key), len(ranks)))
    return list(out.values())


def strategic_merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            out[name] = [v for v in out.get(name) or [] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            out.pop(key, None)
        elif isinstance(value, list):
            out[key] = _merge_list(key, out.get(key) or [], value, orders.get(key))
        else:
            merged = strategic_merge(out.get(key), value)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
    for key, order in orders.items():   # reordered (or shrunk) without other changes
        if key not in patch and isinstance(out.get(key), list):
            out[key] = _merge_list(key, out[key], [], order) if order else []
            mk = _merge_key(key, out[key])
            if mk:
                wanted = {o.get(mk) for o in order if isinstance(o, dict)}
                out[key] = [o for o in out[key] if o.get(mk) in wanted]
    if retain is not None:
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(target)
    for op in ops:
        parts = _pointer(op["path"])
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1] if parts else None
        kind = op["op"]
        if kind == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if here != op["value"]:
                raise ValueError(f"json patch test failed at {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(idx, op["value"])
                else:
                    parent[idx] = op["value"]
            else:
                parent[last] = op["value"]
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ValueError(f"unsupported json patch op {kind!r}")
    return doc
