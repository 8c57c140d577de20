"""Admission of custom resources, as a real API server does it for a CRD's structural schema.

On every write of a custom resource (create, update, patch, server-side apply, the status
subresource): unknown fields are pruned (an error under `fieldValidation=Strict`, which
kubectl sends by default; a warning under `Warn`), `null`s of non-nullable fields dropped,
schema defaults filled in, then the OpenAPI checks (type, required, enum, bounds, lengths,
pattern, item and property counts) and the CEL rules (`x-kubernetes-validations`, with
`oldSelf` on updates) run. Failures answer 422 with the Status body kube-apiserver builds
(reason Invalid, details.causes with field paths) and its wording, so kubectl prints what
it prints against a real cluster. Updates ratchet as Kubernetes >= 1.33 does: a subtree equal
to the stored one is not validated again, so objects stored under an older schema stay
writable (status patches) until their invalid part changes.

The CEL rules are cel.py's; the error causes, in kube-apiserver's words, causes.py's.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from .causes import cause, join_path, show, type_of
from .cel import MISSING, check_rules


# ---- pruning and defaulting ----

def _preserves(schema: dict[str, Any]) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def prune(schema: dict[str, Any], value: Any, path: str = "",
          root: bool = True) -> list[str]:
    """Drop fields the schema does not know (in place); the paths dropped."""
    dropped: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for name in list(value):
            if root and name in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and name in props:
                dropped += prune(props[name], value[name], join_path(path, name), False)
            elif isinstance(extra, dict):
                dropped += prune(extra, value[name], join_path(path, name), False)
            elif not (_preserves(schema) or extra is True or schema.get(
                    "x-kubernetes-embedded-resource")) and (props is not None or
                                                            schema.get("type") == "object"):
                del value[name]
                dropped.append(join_path(path, name))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            dropped += prune(schema["items"], item, f"{path}[{i}]", False)
    return dropped


def default(schema: dict[str, Any], value: Any) -> Any:
    """Fill missing (or null, when not nullable) properties from `default`, recursively."""
    if isinstance(value, dict):
        for name, child in (schema.get("properties") or {}).items():
            if name in value and value[name] is None and not child.get("nullable"):
                del value[name]
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = default(child, value[name])
        if isinstance(schema.get("additionalProperties"), dict):
            for name in value:
                value[name] = default(schema["additionalProperties"], value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [default(schema["items"], item) for item in value]
    return value


# ---- validation ----

def _check_value(schema: dict[str, Any], value: Any, path: str) -> list[dict[str, str]]:
    """The OpenAPI checks of one node (not its children)."""
    where = f"{path or 'body'} in body"
    want = schema.get("type")
    if value is None:
        if schema.get("nullable") or not want:
            return []
        return [cause(path, "Invalid value", "null",
                      f'{where} must be of type {want}: "null"')]
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            return [cause(path, "Invalid value", type_of(value),
                          f'{where} must be of type integer or string: "{type_of(value)}"')]
    elif want:
        got = type_of(value)
        if not (got == want or (want == "number" and got == "integer")):
            return [cause(path, "Invalid value", got,
                          f'{where} must be of type {want}: "{got}"')]
    out = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v if isinstance(v, str) else show(v))
                            for v in schema["enum"])
        out.append(cause(path, "Unsupported value", value, f"supported values: {allowed}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None:
            if schema.get("exclusiveMinimum") and not value > low:
                out.append(cause(path, "Invalid value", value,
                                 f"{where} should be greater than {show(low)}"))
            elif not schema.get("exclusiveMinimum") and value < low:
                out.append(cause(path, "Invalid value", value,
                                 f"{where} should be greater than or equal to {show(low)}"))
        if high is not None:
            if schema.get("exclusiveMaximum") and not value < high:
                out.append(cause(path, "Invalid value", value,
                                 f"{where} should be less than {show(high)}"))
            elif not schema.get("exclusiveMaximum") and value > high:
                out.append(cause(path, "Invalid value", value,
                                 f"{where} should be less than or equal to {show(high)}"))
        step = schema.get("multipleOf")
        if step and (value / step) != int(value / step):
            out.append(cause(path, "Invalid value", value,
                             f"{where} should be a multiple of {show(step)}"))
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            n = schema["maxLength"]
            out.append(cause(path, "Too long", None,
                             f"may not be more than {n} byte{'s' if n != 1 else ''}"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append(cause(path, "Invalid value", value,
                             f"{where} should be at least {schema['minLength']} chars long"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(cause(path, "Invalid value", value,
                             f"{where} should match '{schema['pattern']}'"))
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            n = schema["maxItems"]
            out.append(cause(path, "Too many", len(value),
                             f"must have at most {n} item{'s' if n != 1 else ''}"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(cause(path, "Invalid value", len(value),
                             f"{where} should have at least {schema['minItems']} items"))
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            n = schema["maxProperties"]
            out.append(cause(path, "Too many", len(value),
                             f"must have at most {n} item{'s' if n != 1 else ''}"))
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            out.append(cause(path, "Invalid value", len(value),
                             f"{where} should have at least {schema['minProperties']} "
                             "properties"))
        for name in schema.get("required") or []:
            if name not in value:
                out.append(cause(join_path(path, name), "Required value"))
    return out


def validate(schema: dict[str, Any], value: Any, old: Any = MISSING, path: str = "",
             root: bool = True) -> list[dict[str, str]]:
    """Every cause `value` breaks; with `old` (an update), unchanged subtrees are skipped."""
    if old is not MISSING and old == value:
        return []   # ratcheting: what did not change is not validated again
    if root:
        causes = []
        for name, child in (schema.get("properties") or {}).items():
            if name != "metadata" and isinstance(value, dict) and name in value:
                child_old = old.get(name, MISSING) if isinstance(old, dict) else MISSING
                causes += validate(child, value[name], child_old, name, False)
        required = [n for n in schema.get("required") or [] if n not in (value or {})]
        causes += [cause(n, "Required value") for n in required]
        return causes + check_rules(schema, value, old, "", True)
    causes = _check_value(schema, value, path)
    if causes and any("must be of type" in c["message"] for c in causes):
        return causes   # children of a value of the wrong type are not checked
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        for name, child_value in value.items():
            child = (schema.get("properties") or {}).get(name)
            if child is None and isinstance(extra, dict):
                child = extra
            if child is not None:
                child_old = old.get(name, MISSING) if isinstance(old, dict) else MISSING
                causes += validate(child, child_value, child_old, join_path(path, name), False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        olds = {}
        if schema.get("x-kubernetes-list-type") == "map" and isinstance(old, list):
            olds = {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}
        for i, item in enumerate(value):
            key = tuple(item.get(k) for k in keys) if isinstance(item, dict) else None
            causes += validate(schema["items"], item, olds.get(key, MISSING),
                               f"{path}[{i}]", False)
    return causes + check_rules(schema, value, old, path, False)


# ---- the admission step the server runs ----

@dataclass
class Admitted:
    obj: dict[str, Any]
    warnings: list[str]


class Invalid(Exception):
    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def admit(schema: dict[str, Any], kind: str, group: str, version: str, obj: dict[str, Any],
          old: dict[str, Any] | None, field_validation: str) -> Admitted:
    """Prune, default and validate `obj` (a copy is returned) against a CRD's schema."""
    obj = copy.deepcopy(obj)
    unknown = prune(schema, obj)
    mode = (field_validation or "Warn").capitalize()
    if unknown and mode == "Strict":
        fields = ", ".join(f'unknown field "{p}"' for p in unknown)
        raise Invalid(400, "BadRequest", f'{kind} in version "{version}" cannot be handled '
                      f"as a {kind}: strict decoding error: {fields}")
    warnings = [f'unknown field "{p}"' for p in unknown] if mode == "Warn" else []
    default(schema, obj)
    old_value: Any = MISSING if old is None else old
    causes = validate(schema, obj, old_value)
    if causes:
        name = (obj.get("metadata") or {}).get("name", "")
        qualified = f"{kind}.{group}"
        errors = [f"{c['field']}: {c['message']}" for c in causes]
        summary = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise Invalid(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}',
                      {"name": name, "group": group, "kind": kind, "causes": causes})
    return Admitted(obj, warnings)
