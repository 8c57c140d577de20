"""Run the CRD's CEL rules (x-kubernetes-validations) on objects, as the API server would.

No API server runs here, so the rules are evaluated in the local API server's CEL
environment (localcluster/api/cel.py: cel-python with the Kubernetes regex library's
`find`): the schema is walked with the object, structural defaults are applied first
(Kubernetes defaults before it validates), and every rule runs with `self` bound to the
value at the node that declares it; rules on absent fields do not run.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import celpy

from localcluster.api.admission import default as apply_defaults
from localcluster.api.cel import program


@dataclasses.dataclass(frozen=True)
class Rule:
    path: str       # where the rule is declared: "spec.engine.extraArgs"
    rule: str
    message: str

    def holds(self, value: Any) -> bool:
        result = program(self.rule).evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, celpy.CELEvalError):
            raise AssertionError(f"rule at {self.path} failed to evaluate: {result}")
        return bool(result)


def rules(schema: dict[str, Any], path: str = "") -> list[Rule]:
    """Every rule declared in the schema."""
    found = [Rule(path, r["rule"], r.get("message", ""))
             for r in schema.get("x-kubernetes-validations") or []]
    for name, child in (schema.get("properties") or {}).items():
        found += rules(child, f"{path}.{name}".lstrip("."))
    if isinstance(schema.get("items"), dict):
        found += rules(schema["items"], f"{path}[]")
    return found


def violations(schema: dict[str, Any], obj: Any) -> list[Rule]:
    """The rules `obj` breaks (after defaulting a copy of it)."""
    def walk(node: dict[str, Any], value: Any, path: str) -> list[Rule]:
        broken = [rule for rule in (Rule(path, r["rule"], r.get("message", ""))
                                    for r in node.get("x-kubernetes-validations") or [])
                  if not rule.holds(value)]
        if isinstance(value, dict):
            for name, child in (node.get("properties") or {}).items():
                if name in value and value[name] is not None:
                    broken += walk(child, value[name], f"{path}.{name}".lstrip("."))
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for item in value:
                broken += walk(node["items"], item, f"{path}[]")
        return broken
    return walk(schema, apply_defaults(schema, copy.deepcopy(obj)), "")
