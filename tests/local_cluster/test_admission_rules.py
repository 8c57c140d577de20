"""CEL rules that fail to evaluate (a field the rule reads is absent) are a field error,
as kube-apiserver reports them, not a server error. No cluster."""
from __future__ import annotations

from localcluster.api.admission import validate

SCHEMA = {"type": "object", "properties": {"spec": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "x-kubernetes-validations": [{"rule": "self.a > 1", "message": "a must be above 1"}]}}}


def test_a_rule_reading_an_absent_field_is_an_invalid_value_of_its_node():
    [cause] = validate(SCHEMA, {"spec": {"b": 1}})
    assert cause["field"] == "spec" and cause["reason"] == "FieldValueInvalid"
    assert cause["message"].startswith('Invalid value: "object": self.a > 1: evaluation failed')


def test_a_rule_that_holds_or_breaks():
    assert validate(SCHEMA, {"spec": {"a": 2}}) == []
    assert validate(SCHEMA, {"spec": {"a": 0}}) == [{
        "reason": "FieldValueInvalid", "field": "spec",
        "message": 'Invalid value: "object": a must be above 1'}]
