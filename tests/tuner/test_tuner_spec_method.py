"""The speculative method and its length as one search dimension (num_speculative_tokens:
0/off, K or ngram:K, suffix:K): parsed, converted to the engine's flag, to the CRD's
spec.engine.speculative (a merge patch onto the target's), read back from a baseline, and
simulated."""
import json
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.entrypoints.cli import build_parser, engine_kwargs
from paged_api.search_space import (SpaceError, build_space, engine_values, from_engine_spec,
                                 parse_param, to_spec_patch)
from paged_api.contract import search_space
from paged_api.service import parse_spec
from tuner.incluster.service_runner import merge_patch
from tuner.measure.local import EngineLaunch
from tuner.search.report import validate_patch

SUFFIX_FIELDS = ("suffixDecodingMaxTreeDepth", "suffixDecodingMaxCachedRequests",
                 "suffixDecodingMaxSpecFactor", "suffixDecodingMinTokenProb")


def test_one_dimension_holds_off_ngram_and_suffix_with_their_lengths():
    param = parse_param("num_speculative_tokens", "off,ngram:4,suffix:8,2")
    assert param.choices == (0, 4, "suffix:8", 2)   # canonical: an n-gram length is an int
    assert parse_param("num_speculative_tokens", ["0", "Suffix:16", 8]).choices == (
        0, "suffix:16", 8)
    assert parse_param("num_speculative_tokens", "0..8").low == 0  # a range: n-gram lengths
    default = {p.name: p for p in build_space()}["num_speculative_tokens"]
    assert {v for v in default.choices if isinstance(v, str)} >= {"suffix:8"}
    assert 0 in default.choices and 4 in default.choices
    # in-cluster: spec.searchSpace's camelCase key, a list of the same values
    [param] = search_space({"numSpeculativeTokens": [0, "ngram:4", "suffix:8"]})
    assert param.choices == (0, 4, "suffix:8")


@pytest.mark.parametrize("spec, words", [
    ("suffix:17", r"num_speculative_tokens must be a whole number in 1..16, got 17 \(or 0"),
    ("eagle:4", "expected off, K, ngram:K or suffix:K"),
    ("suffix:x", "expected off, K, ngram:K or suffix:K"),
    ("ngram:2.5", "expected off, K, ngram:K or suffix:K"),
])
def test_bad_values_name_the_dimension_and_its_forms(spec, words):
    with pytest.raises(SpaceError, match=words):
        parse_param("num_speculative_tokens", spec)
    with pytest.raises(ValueError, match="spec.searchSpace.numSpeculativeTokens"):
        search_space({"numSpeculativeTokens": [spec]})


def _flag(value):
    process = EngineLaunch().process({"num_speculative_tokens": value}, Path("engine.log"))
    flags = process.command[process.command.index("--port") + 2:]
    return flags


@pytest.mark.parametrize("value, method", [(4, "ngram"), ("suffix:8", "suffix")])
def test_the_local_runner_starts_the_engine_with_the_method_and_its_length(value, method):
    flags = _flag(value)
    assert flags[0] == "--speculative-config"
    k = int(str(value).split(":")[-1])
    assert json.loads(flags[1]) == {"method": method, "num_speculative_tokens": k}
    config = EngineConfig(**engine_kwargs(build_parser().parse_args(["serve", *flags])))
    assert config.speculative_config["method"] == method
    assert config.speculative_config["num_speculative_tokens"] == k
    assert _flag(0) == []


def test_the_crd_patch_switches_the_method_and_removes_the_other_methods_keys():
    patch = {"spec": to_spec_patch({"num_speculative_tokens": "suffix:8"})}
    assert patch["spec"]["engine"]["speculative"] == {
        "method": "suffix", "numSpeculativeTokens": 8, "promptLookupMax": None,
        "promptLookupMin": None}
    assert validate_patch(patch) is True
    # onto a target with n-gram bounds (as the trial service and the applied best do) ...
    target = {"model": {"uri": "a/b"}, "engine": {"speculative": {
        "method": "ngram", "numSpeculativeTokens": 2, "promptLookupMax": 3}}}
    merged = merge_patch(target, patch["spec"])
    assert merged["engine"]["speculative"] == {"method": "suffix", "numSpeculativeTokens": 8}
    assert parse_spec(merged, name="t", namespace="d").engine.applied()["speculative"][
        "method"] == "suffix"
    # ... and back to n-gram from a suffix target
    target["engine"]["speculative"] = {"method": "suffix", "numSpeculativeTokens": 8,
                                       "suffixDecodingMaxTreeDepth": 16}
    back = merge_patch(target, to_spec_patch({"num_speculative_tokens": 4}))
    assert back["engine"]["speculative"] == {"method": "ngram", "numSpeculativeTokens": 4}
    assert not set(SUFFIX_FIELDS) & set(back["engine"]["speculative"])
    parse_spec(back, name="t", namespace="d")
    off = to_spec_patch({"num_speculative_tokens": 0})["engine"]
    assert off == {"speculative": None}


def test_engine_values_keep_the_given_configs_own_keys_of_the_chosen_method():
    given = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                    "prompt_lookup_max": 3, "disable_by_batch_size": 8}}
    assert engine_values({**given, "num_speculative_tokens": "suffix:8"}) == {
        "speculative_config": {"method": "suffix", "num_speculative_tokens": 8,
                               "disable_by_batch_size": 8}}
    assert engine_values({**given, "num_speculative_tokens": 4})["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "disable_by_batch_size": 8}


@pytest.mark.parametrize("speculative, value", [
    ({"method": "suffix", "numSpeculativeTokens": 6}, "suffix:6"),
    ({"numSpeculativeTokens": 6}, 6),           # the method's default: n-gram
    (None, 0),
])
def test_a_baseline_reads_back_as_the_dimensions_value(speculative, value):
    engine = {"maxNumSeqs": 8, "speculative": speculative}
    params = from_engine_spec(engine)
    assert params["num_speculative_tokens"] == value
    if speculative:   # and converts back to the same method and length
        again = to_spec_patch({"num_speculative_tokens": value})["engine"]["speculative"]
        assert {k: v for k, v in again.items() if v is not None} == {
            "method": "ngram", **speculative}


def test_a_suffix_setting_simulates_like_an_ngram_one():
    """The simulator builds the engine from the same values (tuner/sim/engine.py): suffix's
    drafts, like n-gram's, are verified and accepted at --acceptance."""
    from tuner.sim.engine import sim_engine
    from tuner.sim.simulate import simulate
    from tuner.sim.stream import TraceStream
    from test_sim_engine import SETTINGS, _profile, _trace
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path

    hf_config = AutoConfig.from_pretrained(resolve_model_path(None))
    engine, _ = sim_engine(_profile(), {**SETTINGS, "num_speculative_tokens": "suffix:4"},
                           hf_config=hf_config)
    assert engine.config.speculative_config["method"] == "suffix"

    def steps(value, acceptance):
        result = simulate(_profile(), {**SETTINGS, "num_speculative_tokens": value},
                          TraceStream(_trace(), max_model_len=256), duration=30.0, slos={},
                          hf_config=hf_config, acceptance=acceptance)
        assert result.figures["completed"] == len(_trace())
        return result.figures["steps"]

    off = steps(0, 1.0)
    assert steps("suffix:4", 1.0) < off      # accepted drafts: fewer steps
    assert steps("suffix:4", 0.0) == off     # rejected ones: none saved
