"""The CRD's CEL rules, executed (cel-python) on valid and invalid resources, and checked
against the operator's own parser: what one rejects, the other rejects too."""
from __future__ import annotations

import re

import pytest
import yaml
from cel_tools import Rule, rules, violations
from chart_tools import ROOT, crd, with_spec

from paged_api.service import MANAGED_FLAGS, InvalidSpecError, parse_spec

SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
RULES = rules(SCHEMA)

VALID = [
    {},
    {"engine__maxNumSeqs": 64, "engine__maxNumBatchedTokens": 64},
    {"engine__maxNumBatchedTokens": 256},                 # >= the engine's default 256 seqs
    {"engine__maxNumSeqs": 2048},                         # <= the engine's default 2048 tokens
    {"engine__extraArgs": ["--seed", "7", "--max-num-partial-prefills=2", "--enforce-eager",
                           "--model-impl", "x", "--hostname-alias", "--portable"]},
    {"autoscaling": {"maxReplicas": 1}},                  # minReplicas defaults to 1
    {"autoscaling": {"minReplicas": 3, "maxReplicas": 3}},
    {"autoscaling": {"mode": "slo", "minReplicas": 0, "maxReplicas": 2,
                     "slo": {"ttftSeconds": 1}}, "router": {"enabled": True}},
    {"modelCache": {"claimName": "weights"}},
    {"modelCache": {"size": "10Gi"}},
    {"model__uri": "pvc://models/llama...3/v..2"},         # dots inside names are fine
    {"model__uri": "/models/.cache/x"},
    {"model__uri": "builtin://smollm2-135m-instruct"},
    {"engine__speculative": {"numSpeculativeTokens": 4}},
    {"engine__speculative": {"numSpeculativeTokens": 4, "promptLookupMin": 9}},  # max: 9 too
    {"engine__speculative": {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 3,
                             "promptLookupMin": 3}},
    {"engine__speculative": {"method": "suffix", "numSpeculativeTokens": 8,
                             "suffixDecodingMaxTreeDepth": 32,
                             "suffixDecodingMinTokenProb": 0.2}},
    {"kvCache": {"offloadGiB": 4, "disk": {"sizeGiB": 20, "volume": {"emptyDir": {}}}}},
    {"kvCache": {"disk": {"sizeGiB": 1.5, "volume": {"persistentVolumeClaim": {
        "claimName": "kv-blocks"}}}}},
    # tiers off: no prefix caching needed
    {"kvCache": {"offloadGiB": 0}, "engine__enablePrefixCaching": False},
    {"kvCache": {"offloadGiB": 2.5}, "engine__enablePrefixCaching": True},
]
# (changes, where the broken rule is declared)
INVALID = [
    ({"engine__maxNumSeqs": 64, "engine__maxNumBatchedTokens": 32}, "spec.engine"),
    # The other side unset takes the engine's default (256 seqs, 2048 tokens), as the engine
    # would, so a spec the engine refuses at start-up is refused at admission.
    ({"engine__maxNumBatchedTokens": 8}, "spec.engine"),
    ({"engine__maxNumSeqs": 4096}, "spec.engine"),
    ({"engine__extraArgs": ["--block-size=8"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--hos", "0.0.0.0"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--por=1"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--block", "1"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--served-model", "x"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--max-model", "99"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--seed", "1", "--api-key", "k"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--no-enable-prefix-caching"]}, "spec.engine.extraArgs"),
    # spec.router.policy: precise sets it (the events' ports are the Service's and the
    # NetworkPolicy's)
    ({"engine__extraArgs": ["--kv-events-config={}"]}, "spec.engine.extraArgs"),
    ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "spec.autoscaling"),
    ({"autoscaling": {"minReplicas": 2, "maxReplicas": 1}}, "spec.autoscaling"),
    ({"autoscaling": {"minReplicas": 0, "maxReplicas": 1}, "router": {"enabled": True}},
     "spec.autoscaling"),
    ({"autoscaling": {"mode": "metrics", "minReplicas": 0, "maxReplicas": 1},
      "router": {"enabled": True}}, "spec.autoscaling"),
    ({"autoscaling": {"mode": "slo", "minReplicas": 0, "maxReplicas": 1,
                      "slo": {"ttftSeconds": 1}}}, "spec"),
    ({"autoscaling": {"mode": "slo", "minReplicas": 0, "maxReplicas": 1,
                      "slo": {"ttftSeconds": 1}}, "router": {"enabled": False}}, "spec"),
    ({"autoscaling": {"mode": "slo", "maxReplicas": 1}}, "spec.autoscaling"),
    ({"autoscaling": {"mode": "slo", "maxReplicas": 1, "slo": {}}}, "spec.autoscaling"),
    ({"modelCache": {"claimName": "c", "size": "1Gi"}}, "spec.modelCache"),
    ({"modelCache": {"storageClassName": "fast"}}, "spec.modelCache"),
    ({"model__uri": "pvc://models/../etc"}, "spec.model.uri"),
    ({"model__uri": "pvc://models/%2e%2e/etc"}, "spec.model.uri"),
    ({"model__uri": "/models/.%2E"}, "spec.model.uri"),
    ({"model__uri": "/models/%252e%252e/x"}, "spec.model.uri"),
    ({"model__uri": "hf://org/.."}, "spec.model.uri"),
    ({"engine__speculative": {"numSpeculativeTokens": 2, "promptLookupMin": 4,
                              "promptLookupMax": 3}}, "spec.engine.speculative"),
    # each method's keys with that method only (ngram is the default)
    ({"engine__speculative": {"method": "suffix", "numSpeculativeTokens": 2,
                              "promptLookupMax": 3}}, "spec.engine.speculative"),
    ({"engine__speculative": {"numSpeculativeTokens": 2, "suffixDecodingMaxTreeDepth": 8}},
     "spec.engine.speculative"),
    ({"engine__extraArgs": ["--speculative-config", "{}"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--kv-offloading-size=4"]}, "spec.engine.extraArgs"),
    ({"engine__extraArgs": ["--kv-disk-d", "/x"]}, "spec.engine.extraArgs"),
    ({"kvCache": {"disk": {"sizeGiB": 2, "volume": {}}}}, "spec.kvCache.disk.volume"),
    ({"kvCache": {"disk": {"sizeGiB": 2, "volume": {
        "emptyDir": {}, "persistentVolumeClaim": {"claimName": "c"}}}}},
     "spec.kvCache.disk.volume"),
    # the one rule across sections (at spec): the tiers hold prefix-cache blocks
    ({"kvCache": {"offloadGiB": 0.5}, "engine__enablePrefixCaching": False}, "spec"),
    ({"kvCache": {"disk": {"sizeGiB": 2, "volume": {"emptyDir": {}}}},
      "engine__enablePrefixCaching": False}, "spec"),
]


def test_every_rule_compiles_and_is_exercised_by_an_invalid_case():
    assert len(RULES) >= 6
    broken_somewhere = set()
    for changes, _ in INVALID:
        broken_somewhere |= {r.rule for r in violations(SCHEMA, with_spec(**changes))}
    broken_somewhere |= {r.rule for r in violations(SCHEMA, with_spec_named("x" * 53))}
    assert {r.rule for r in RULES} == broken_somewhere, "a CEL rule no test case breaks"


def with_spec_named(name):
    body = with_spec()
    body["metadata"]["name"] = name
    return body


@pytest.mark.parametrize("changes", VALID)
def test_valid_resources_pass_every_rule_and_the_operator(changes):
    body = with_spec(**changes)
    assert violations(SCHEMA, body) == []
    parse_spec(body["spec"], name="svc", namespace="default")


@pytest.mark.parametrize("changes, path", INVALID)
def test_invalid_resources_break_the_rule_and_the_operator_rejects_them(changes, path):
    body = with_spec(**changes)
    broken = violations(SCHEMA, body)
    assert [r.path for r in broken] == [path], broken
    # the spec-level rules: kvCache with prefix caching, minReplicas 0 with the router
    field = "(kvCache|autoscaling)" if path == "spec" else path.removeprefix("spec.").split(".")[0]
    with pytest.raises(InvalidSpecError, match=f"spec.{field}"):
        parse_spec(body["spec"], name="svc", namespace="default")


def test_long_names_break_the_root_rule_and_the_operator():
    assert violations(SCHEMA, with_spec_named("x" * 52)) == []
    broken = violations(SCHEMA, with_spec_named("x" * 53))
    assert [r.path for r in broken] == [""] and "52" in broken[0].message
    with pytest.raises(InvalidSpecError, match="metadata.name"):
        parse_spec({"model": {"uri": "a/b"}}, name="x" * 53, namespace="default")


def test_the_speculative_rule_names_both_fields_and_the_operator_agrees():
    body = with_spec(engine__speculative={"numSpeculativeTokens": 2, "promptLookupMin": 4,
                                          "promptLookupMax": 3})
    [broken] = violations(SCHEMA, body)
    assert broken.message == "promptLookupMin must be <= promptLookupMax"
    with pytest.raises(InvalidSpecError, match=r"^spec.engine.speculative.promptLookupMin \(4\) "
                                               r"must be <= spec.engine.speculative.promptLookupMax"):
        parse_spec(body["spec"], name="svc", namespace="default")


def test_the_extra_args_rule_lists_exactly_the_operators_managed_flags():
    rule = next(r for r in RULES if r.path == "spec.engine.extraArgs")
    assert tuple(re.findall(r"'(--[a-z-]+)'", rule.rule)) == MANAGED_FLAGS


def test_the_evaluator_is_not_vacuous():
    """A rule that is false must be reported: the harness really evaluates."""
    assert not Rule("x", "self.size() < 2", "").holds([1, 2, 3])
    assert Rule("x", "'--por=1'.find('^[^=]*') == '--por'", "").holds(None)


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_passes_the_cel_rules(example):
    for body in yaml.safe_load_all((ROOT / "examples" / example).read_text()):
        if body and body.get("kind") == "PagedInferenceService":
            assert violations(SCHEMA, body) == []
