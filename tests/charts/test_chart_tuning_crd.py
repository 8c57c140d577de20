"""The PagedInferenceTuning CRD's load fields (workloadFrom, loadWorkers, capacity): its
schema and CEL rules, executed here as the API server would (cel_tools.py), agree with the
operator (which refuses a spec before making a Job) and the tuner (which parses it)."""
from __future__ import annotations

import jsonschema
import pytest
import yaml
from cel_tools import violations
from chart_tools import CHART

from paged_api.contract import spec_error
from paged_api.contract import parse_tuning

CRD = yaml.safe_load((CHART / "crds" / "pagedinferencetunings.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
BASE = {"targetRef": {"name": "svc"}, "searchSpace": {"maxNumSeqs": [4, 8]}}
PROM = {"prometheus": {"url": "http://prom:9090"}}


def tuning(**spec):
    merged = {k: v for k, v in {**BASE, **spec}.items() if v is not None}   # None: unset
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceTuning", "metadata": {"name": "tune"}, "spec": merged}


VALID = [
    {},
    {"workload": "summarize", "loadWorkers": 4, "capacity": {"maxProbes": 3}},
    {"workloadFrom": {"trace": {"configMapRef": {"name": "traffic"}}}},
    {"workloadFrom": {"trace": {"url": "https://traces.example/monday.jsonl"}}},
    {"workloadFrom": {"prometheus": {}}, **PROM},
    {"workloadFrom": {"prometheus": {"window": "7d", "selector": 'app="x"'}}, **PROM},
    {"apply": {"mode": "Auto", "verifyWindow": "90s"}, **PROM},
    {"tunerPods": 3, "storage": {"secretRef": {"name": "optuna-db"}}},
    {"searchSpace": None},   # the settings table's default ranges
    {"searchSpace": {"offloadGiB": [0, 1, 2]}},   # the host KV tier (spec.kvCache)
    {"searchSpace": {"offloadGiB": {"min": 0.5, "max": 4}, "maxNumSeqs": [8]}},
    {"objective": "Capacity", "capacity": {"maxProbes": 4, "attainment": 0.95}},
    {"objective": "Goodput", "rate": 2.0},
    {"objective": "Goodput", "tunerPods": 2, "storage": {"secretRef": {"name": "db"}}},
]
# (spec, where the broken rule is declared, what the operator's message names)
INVALID = [
    ({"workload": "chat", "workloadFrom": {"trace": {"url": "https://x"}}}, "spec",
     "spec.workload and spec.workloadFrom"),
    ({"workloadFrom": {"prometheus": {"window": "1h"}}}, "spec",
     "spec.workloadFrom.prometheus needs spec.prometheus.url"),
    ({"workloadFrom": {"trace": {"url": "https://x"}, "prometheus": {}}, **PROM},
     "spec.workloadFrom", "spec.workloadFrom"),
    ({"workloadFrom": {}}, "spec.workloadFrom", "spec.workloadFrom"),
    ({"workloadFrom": {"trace": {"url": "https://x", "configMapRef": {"name": "t"}}}},
     "spec.workloadFrom.trace", "spec.workloadFrom.trace"),
    ({"apply": {"mode": "Auto", "verifyWindow": "5m"}}, "spec",
     "spec.apply.verifyWindow needs spec.prometheus.url"),
    ({"tunerPods": 2}, "spec", "spec.tunerPods 2 needs spec.storage.secretRef"),
    ({"objective": "Capacity", "rate": 2.0}, "spec",
     "spec.rate: the Capacity objective searches the rate itself"),
    ({"objective": "Capacity", "tunerPods": 2, "storage": {"secretRef": {"name": "db"}}},
     "spec", "spec.tunerPods: the Capacity objective searches on the simulator in one pod"),
]


def test_the_search_space_schema_names_every_dimension_the_tuner_varies():
    """A key the schema does not list would be pruned by the API server, silently."""
    from paged_api.contract import SEARCH_KEYS
    from paged_api.search_space import SETTINGS

    listed = SCHEMA["properties"]["spec"]["properties"]["searchSpace"]["properties"]
    assert set(listed) == {key for key, name in SEARCH_KEYS.items()
                           if SETTINGS[name].type is not dict}
    assert {"numSpeculativeTokens", "offloadGiB"} <= set(listed)
    space = parse_tuning(tuning(searchSpace={"numSpeculativeTokens": [0, 4]})["spec"]).space
    assert [(p.name, p.choices) for p in space] == [("num_speculative_tokens", (0, 4))]


@pytest.mark.parametrize("spec", VALID)
def test_valid_load_sources_pass_the_schema_the_rules_the_operator_and_the_tuner(spec):
    body = tuning(**spec)
    jsonschema.Draft4Validator(SCHEMA).validate(body)
    assert violations(SCHEMA, body) == []   # after defaulting: workload has no default
    assert spec_error(body["spec"]) is None
    parse_tuning(body["spec"])


@pytest.mark.parametrize("spec, path, field", INVALID)
def test_invalid_load_sources_break_a_rule_and_the_operator_and_tuner_refuse_them(
        spec, path, field):
    body = tuning(**spec)
    assert [r.path for r in violations(SCHEMA, body)] == [path]
    assert field in (spec_error(body["spec"]) or "")
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_tuning(body["spec"])


@pytest.mark.parametrize("spec", [{"loadWorkers": 0}, {"loadWorkers": 17},
                                  {"capacity": {"attainment": 1.5}},
                                  {"workloadFrom": {"prometheus": {"window": "a day"}}, **PROM},
                                  {"workloadFrom": {"trace": {"url": "ftp://x"}}},
                                  {"apply": {"verifyWindow": "five minutes"}, **PROM},
                                  {"tunerPods": 0}, {"objective": "capacity"}])
def test_the_schema_bounds_the_new_fields(spec):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(SCHEMA).validate(tuning(**spec))


@pytest.mark.parametrize("example", ["chat.yaml", "summarize.yaml"])
def test_the_tuning_examples_pass_both_crds_the_rules_the_operator_and_the_tuner(example):
    from chart_tools import crd_validator
    from chart_tools import ROOT

    from paged_api.service import parse_spec

    service, tune = yaml.safe_load_all((ROOT / "examples" / "tuning" / example).read_text())
    assert not list(crd_validator().iter_errors(service))
    parse_spec(service["spec"], name=service["metadata"]["name"], namespace="default")
    jsonschema.Draft4Validator(SCHEMA).validate(tune)
    assert violations(SCHEMA, tune) == []
    assert spec_error(tune["spec"]) is None
    assert tune["spec"]["targetRef"]["name"] == service["metadata"]["name"]
    parsed = parse_tuning(tune["spec"])
    assert parsed.workload == example.removesuffix(".yaml")
