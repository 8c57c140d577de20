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

CEL is cel-python (celpy), with the one Kubernetes regex-library function our rules use,
`find`, added; a rule that fails to compile is refused when its CRD is written.
"""
from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

_ENV = celpy.Environment()


def _find(text: Any, pattern: Any) -> celtypes.StringType:
    match = re.search(str(pattern), str(text))
    return celtypes.StringType(match.group(0) if match else "")


_FUNCTIONS = {"find": _find}


@functools.lru_cache(maxsize=512)
def program(rule: str) -> Any:
    """A CEL expression compiled in the API server's environment (cached)."""
    return _ENV.program(_ENV.compile(rule), functions=_FUNCTIONS)


def compile_errors(schema: dict[str, Any], path: str) -> list[dict[str, str]]:
    """Causes for the CEL rules in a CRD's schema that do not compile."""
    causes = []
    for i, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        for key in ("rule", "messageExpression"):
            if key in rule:
                try:
                    program(rule[key])
                except Exception as e:   # celpy raises its parser's errors
                    causes.append(_cause(f"{path}.x-kubernetes-validations[{i}].{key}",
                                         "Invalid value", rule[key],
                                         f"compilation failed: {e}"))
    for name, child in (schema.get("properties") or {}).items():
        causes += compile_errors(child, f"{path}.properties[{name}]")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            causes += compile_errors(schema[key], f"{path}.{key}")
    return causes


# ---- error causes in kube-apiserver's words (field.Error.ErrorBody) ----

def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, separators=(",", ":"))


_REASONS = {"Required value": "FieldValueRequired", "Invalid value": "FieldValueInvalid",
            "Unsupported value": "FieldValueNotSupported", "Too long": "FieldValueTooLong",
            "Too many": "FieldValueTooMany", "Forbidden": "FieldValueForbidden",
            "Duplicate value": "FieldValueDuplicate"}


def _cause(path: str, kind: str, value: Any = None, detail: str = "",
           show_value: bool = True) -> dict[str, str]:
    body = kind if value is None or not show_value else f"{kind}: {_show(value)}"
    if detail:
        body += f": {detail}"
    return {"reason": _REASONS.get(kind, "FieldValueInvalid"), "message": body,
            "field": path or "<nil>"}


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "object")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


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
                dropped += prune(props[name], value[name], _join(path, name), False)
            elif isinstance(extra, dict):
                dropped += prune(extra, value[name], _join(path, name), False)
            elif not (_preserves(schema) or extra is True or schema.get(
                    "x-kubernetes-embedded-resource")) and (props is not None or
                                                            schema.get("type") == "object"):
                del value[name]
                dropped.append(_join(path, name))
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

_MISSING = object()


def _check_value(schema: dict[str, Any], value: Any, path: str) -> list[dict[str, str]]:
    """The OpenAPI checks of one node (not its children)."""
    where = f"{path or 'body'} in body"
    want = schema.get("type")
    if value is None:
        if schema.get("nullable") or not want:
            return []
        return [_cause(path, "Invalid value", "null",
                       f'{where} must be of type {want}: "null"')]
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            return [_cause(path, "Invalid value", _type_of(value),
                           f'{where} must be of type integer or string: "{_type_of(value)}"')]
    elif want:
        got = _type_of(value)
        if not (got == want or (want == "number" and got == "integer")):
            return [_cause(path, "Invalid value", got,
                           f'{where} must be of type {want}: "{got}"')]
    out = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v if isinstance(v, str) else _show(v))
                            for v in schema["enum"])
        out.append(_cause(path, "Unsupported value", value, f"supported values: {allowed}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None:
            if schema.get("exclusiveMinimum") and not value > low:
                out.append(_cause(path, "Invalid value", value,
                                  f"{where} should be greater than {_show(low)}"))
            elif not schema.get("exclusiveMinimum") and value < low:
                out.append(_cause(path, "Invalid value", value,
                                  f"{where} should be greater than or equal to {_show(low)}"))
        if high is not None:
            if schema.get("exclusiveMaximum") and not value < high:
                out.append(_cause(path, "Invalid value", value,
                                  f"{where} should be less than {_show(high)}"))
            elif not schema.get("exclusiveMaximum") and value > high:
                out.append(_cause(path, "Invalid value", value,
                                  f"{where} should be less than or equal to {_show(high)}"))
        step = schema.get("multipleOf")
        if step and (value / step) != int(value / step):
            out.append(_cause(path, "Invalid value", value,
                              f"{where} should be a multiple of {_show(step)}"))
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            n = schema["maxLength"]
            out.append(_cause(path, "Too long", None,
                              f"may not be more than {n} byte{'s' if n != 1 else ''}"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append(_cause(path, "Invalid value", value,
                              f"{where} should be at least {schema['minLength']} chars long"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(_cause(path, "Invalid value", value,
                              f"{where} should match '{schema['pattern']}'"))
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            n = schema["maxItems"]
            out.append(_cause(path, "Too many", len(value),
                              f"must have at most {n} item{'s' if n != 1 else ''}"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(_cause(path, "Invalid value", len(value),
                              f"{where} should have at least {schema['minItems']} items"))
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            n = schema["maxProperties"]
            out.append(_cause(path, "Too many", len(value),
                              f"must have at most {n} item{'s' if n != 1 else ''}"))
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            out.append(_cause(path, "Invalid value", len(value),
                              f"{where} should have at least {schema['minProperties']} "
                              "properties"))
        for name in schema.get("required") or []:
            if name not in value:
                out.append(_cause(_join(path, name), "Required value"))
    return out


def _cel_value(value: Any, root: bool) -> Any:
    if root and isinstance(value, dict) and isinstance(value.get("metadata"), dict):
        # rules see only the name and generateName of the object's metadata
        meta = {k: v for k, v in value["metadata"].items() if k in ("name", "generateName")}
        value = {**value, "metadata": meta}
    return celpy.json_to_cel(value)


def _check_rules(schema: dict[str, Any], value: Any, old: Any, path: str,
                 root: bool) -> list[dict[str, str]]:
    out = []
    for rule in schema.get("x-kubernetes-validations") or []:
        transition = re.search(r"\boldSelf\b", rule["rule"]) is not None
        if transition and old is _MISSING and not rule.get("optionalOldSelf"):
            continue   # a transition rule runs only on updates, where the old value exists
        activation = {"self": _cel_value(value, root)}
        if transition:
            activation["oldSelf"] = _cel_value(None if old is _MISSING else old, root)
        try:
            result = program(rule["rule"]).evaluate(activation)
        except celpy.CELEvalError as e:   # celpy raises some evaluation errors
            result = e
        if result is True or (isinstance(result, celtypes.BoolType) and bool(result)):
            continue
        where = path
        if rule.get("fieldPath"):
            where = (path + rule["fieldPath"]) if path else rule["fieldPath"].lstrip(".")
        if isinstance(result, celpy.CELEvalError):
            message = f"{rule['rule']}: evaluation failed: {result.args[0]}"
        else:
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            if rule.get("messageExpression"):
                try:
                    text = program(rule["messageExpression"]).evaluate(activation)
                except celpy.CELEvalError:
                    text = None
                if isinstance(text, str) and text.strip():
                    message = str(text)
        kind = {"FieldValueForbidden": "Forbidden", "FieldValueRequired": "Required value",
                "FieldValueDuplicate": "Duplicate value"}.get(rule.get("reason", ""),
                                                              "Invalid value")
        out.append(_cause(where, kind, schema.get("type") or "object", message,
                          show_value=kind in ("Invalid value", "Duplicate value")))
    return out


def validate(schema: dict[str, Any], value: Any, old: Any = _MISSING, path: str = "",
             root: bool = True) -> list[dict[str, str]]:
    """Every cause `value` breaks; with `old` (an update), unchanged subtrees are skipped."""
    if old is not _MISSING and old == value:
        return []   # ratcheting: what did not change is not validated again
    if root:
        causes = []
        for name, child in (schema.get("properties") or {}).items():
            if name != "metadata" and isinstance(value, dict) and name in value:
                child_old = old.get(name, _MISSING) if isinstance(old, dict) else _MISSING
                causes += validate(child, value[name], child_old, name, False)
        required = [n for n in schema.get("required") or [] if n not in (value or {})]
        causes += [_cause(n, "Required value") for n in required]
        return causes + _check_rules(schema, value, old, "", True)
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
                child_old = old.get(name, _MISSING) if isinstance(old, dict) else _MISSING
                causes += validate(child, child_value, child_old, _join(path, name), False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        olds = {}
        if schema.get("x-kubernetes-list-type") == "map" and isinstance(old, list):
            olds = {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}
        for i, item in enumerate(value):
            key = tuple(item.get(k) for k in keys) if isinstance(item, dict) else None
            causes += validate(schema["items"], item, olds.get(key, _MISSING),
                               f"{path}[{i}]", False)
    return causes + _check_rules(schema, value, old, path, False)


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
    old_value: Any = _MISSING if old is None else old
    causes = validate(schema, obj, old_value)
    if causes:
        name = (obj.get("metadata") or {}).get("name", "")
        qualified = f"{kind}.{group}"
        errors = [f"{c['field']}: {c['message']}" for c in causes]
        summary = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise Invalid(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}',
                      {"name": name, "group": group, "kind": kind, "causes": causes})
    return Admitted(obj, warnings)
