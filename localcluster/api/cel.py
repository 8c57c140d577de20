"""The CEL rules of a CRD's schema (`x-kubernetes-validations`), as the API server runs
them: compiled when the CRD is written, evaluated on every write of a custom resource
(admission.py), with `oldSelf` on updates.

CEL is cel-python (celpy), with the one Kubernetes regex-library function our rules use,
`find`, added; a rule that fails to compile is refused when its CRD is written.
"""
from __future__ import annotations

import functools
import re
from typing import Any

import celpy
from celpy import celtypes

from .causes import cause

# No old value: a create. Transition rules (on `oldSelf`) do not run then.
MISSING = object()

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
                    causes.append(cause(f"{path}.x-kubernetes-validations[{i}].{key}",
                                        "Invalid value", rule[key],
                                        f"compilation failed: {e}"))
    for name, child in (schema.get("properties") or {}).items():
        causes += compile_errors(child, f"{path}.properties[{name}]")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            causes += compile_errors(schema[key], f"{path}.{key}")
    return causes


def _cel_value(value: Any, root: bool) -> Any:
    if root and isinstance(value, dict) and isinstance(value.get("metadata"), dict):
        # rules see only the name and generateName of the object's metadata
        meta = {k: v for k, v in value["metadata"].items() if k in ("name", "generateName")}
        value = {**value, "metadata": meta}
    return celpy.json_to_cel(value)


def check_rules(schema: dict[str, Any], value: Any, old: Any, path: str,
                root: bool) -> list[dict[str, str]]:
    out = []
    for rule in schema.get("x-kubernetes-validations") or []:
        transition = re.search(r"\boldSelf\b", rule["rule"]) is not None
        if transition and old is MISSING and not rule.get("optionalOldSelf"):
            continue   # a transition rule runs only on updates, where the old value exists
        activation = {"self": _cel_value(value, root)}
        if transition:
            activation["oldSelf"] = _cel_value(None if old is MISSING else old, root)
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
        out.append(cause(where, kind, schema.get("type") or "object", message,
                         show_value=kind in ("Invalid value", "Duplicate value")))
    return out
