"""Speculative decoding as a tuner dimension: num_speculative_tokens (0 = off) in the space,
mapped to speculative_config by both runners, and the acceptance rate in the report."""
import json
from pathlib import Path

import optuna
import pytest

from engine.config import EngineConfig
from engine.entrypoints.cli import build_parser, engine_kwargs
from paged_api.contract import search_space
from tuner.incluster.service_runner import ServiceRunner
from tuner.measure import server_metrics as metrics
from tuner.measure.loadgen import LoadSpec
from tuner.measure.local import EngineLaunch
from tuner.measure.runner import Infeasible, TrialRequest
from tuner.search.confirm import Baseline, candidates, engine_defaults
from tuner.search.report import best_table, confirmation_table, validate_patch
from paged_api.search_space import (SpaceError, build_space, from_engine_spec, parse_param,
                                 to_engine_spec)


def test_the_default_space_searches_num_speculative_tokens_with_zero_as_off():
    space = {p.name: p for p in build_space()}
    assert space["num_speculative_tokens"].choices == (0, 2, 4, 8, "suffix:8", "suffix:16")
    assert parse_param("num_speculative_tokens", "0..8").low == 0
    assert engine_defaults(["num_speculative_tokens"]) == {"num_speculative_tokens": 0}
    # in-cluster: spec.searchSpace uses the key's camelCase name
    [param] = search_space({"numSpeculativeTokens": [0, 4]})
    assert (param.name, param.choices) == ("num_speculative_tokens", (0, 4))


@pytest.mark.parametrize("name, spec, words", [
    ("num_speculative_tokens", "0,17", r"num_speculative_tokens must be a whole number in "
                                       r"1..16, got 17 \(or 0: speculative_config off\)"),
    ("num_speculative_tokens", "-1..4", "got -1"),
    ("speculative_config", "4", "searched by its keys, not as a whole: num_speculative_tokens"),
])
def test_bad_speculative_spaces_name_what_to_change(name, spec, words):
    with pytest.raises(SpaceError, match=words):
        parse_param(name, spec)


def _engine_flags(settings: dict) -> list[str]:
    process = EngineLaunch().process(settings, Path("engine.log"))
    return process.command[process.command.index("--port") + 2:]


def test_the_local_runner_starts_the_engine_with_the_speculative_config_flag():
    flags = _engine_flags({"max_num_seqs": 8, "num_speculative_tokens": 4})
    assert flags[:2] == ["--max-num-seqs", "8"]
    assert flags[2] == "--speculative-config"
    assert json.loads(flags[3]) == {"method": "ngram", "num_speculative_tokens": 4}
    config = EngineConfig(**engine_kwargs(build_parser().parse_args(["serve", *flags])))
    assert config.speculative_config["num_speculative_tokens"] == 4
    assert _engine_flags({"max_num_seqs": 8, "num_speculative_tokens": 0}) == [
        "--max-num-seqs", "8"]


class RecordingCluster:
    def __init__(self) -> None:
        self.created = []
        self.stopping = type("Never", (), {"is_set": staticmethod(lambda: False)})()

    def create_trial(self, name, target, engine, owner):
        self.created.append(engine)

    def wait_ready(self, name, timeout):
        raise Infeasible("not started in this test")

    def delete_service(self, name, wait=False):
        pass


@pytest.mark.parametrize("tokens, speculative", [
    (4, {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 3}),
    (0, None),                       # off: the target's speculative is dropped
])
def test_the_service_runner_writes_spec_engine_speculative(tmp_path, tokens, speculative):
    target = {"spec": {"engine": {"maxNumSeqs": 64, "speculative": {
        "numSpeculativeTokens": 2, "promptLookupMax": 3}}}}
    cluster = RecordingCluster()
    runner = ServiceRunner(cluster, "tune", {"uid": "u"}, target,
                           LoadSpec(workload="chat", duration=1, users=1), {}, startup_timeout=1)
    request = TrialRequest(name="trial-0001", seed=0, workdir=tmp_path,
                           settings={"num_speculative_tokens": tokens})
    with pytest.raises(Infeasible):
        runner.run(request)
    [engine] = cluster.created
    assert engine.get("speculative") == speculative     # the target's lookup bound kept
    assert engine["maxNumSeqs"] == 64


def test_a_patch_that_turns_speculation_off_removes_it_and_fits_the_crd():
    patch = {"spec": {"engine": to_engine_spec({"num_speculative_tokens": 0,
                                                "max_num_seqs": 8})}}
    assert patch["spec"]["engine"] == {"speculative": None, "maxNumSeqs": 8}
    assert validate_patch(patch) is True
    on = to_engine_spec({"num_speculative_tokens": 8})
    assert on == {"speculative": {"method": "ngram", "numSpeculativeTokens": 8, **{
        k: None for k in ("suffixDecodingMaxTreeDepth", "suffixDecodingMaxCachedRequests",
                          "suffixDecodingMaxSpecFactor", "suffixDecodingMinTokenProb")}}}
    assert validate_patch({"spec": {"engine": on}}) is True


def test_a_baseline_with_speculation_compares_with_the_searched_dimension():
    params = from_engine_spec({"speculative": {"numSpeculativeTokens": 4}, "maxNumSeqs": 8})
    assert params["num_speculative_tokens"] == 4
    baseline = Baseline(params, params, "spec.engine")
    study = _study([({"num_speculative_tokens": 4, "max_num_seqs": 8}, 5.0, {}),
                    ({"num_speculative_tokens": 0, "max_num_seqs": 8}, 4.0, {})])
    assert [g["params"] for g in candidates(study, 2, baseline)] == [
        {"num_speculative_tokens": 0, "max_num_seqs": 8}]


def _study(records):
    study = optuna.create_study(direction="maximize")
    for params, goodput, extra in records:
        study.add_trial(optuna.trial.create_trial(
            params=params, value=goodput, user_attrs={"goodput": goodput, **extra},
            distributions={k: optuna.distributions.CategoricalDistribution([0, 4, 8])
                           for k in params}))
    return study


def test_the_report_shows_the_acceptance_rate_beside_goodput_and_a_dash_when_off():
    study = _study([({"num_speculative_tokens": 4}, 3.0, {"spec_acceptance_rate": 0.625,
                                                           "spec_draft_tokens": 80.0}),
                    ({"num_speculative_tokens": 0}, 2.0, {"spec_draft_tokens": 0.0})])
    header, on, off, _ = best_table(study).splitlines()
    assert header.split()[:5] == ["trials", "num_speculative_tokens", "n", "goodput/s",
                                  "accept"]
    assert on.split()[1:5] == ["4", "1", "3.00", "0.62"]
    assert off.split()[1:5] == ["0", "1", "2.00", "-"]
    study.set_user_attr("confirmation", {
        "arms": [{"label": "baseline", "trials": [], "source": "defaults",
                  "params": {"num_speculative_tokens": 0}, "goodput": [2.0, 2.2],
                  "failed": [None, None], "figures": [{"spec_draft_tokens": 0.0}] * 2},
                 {"label": "C1", "trials": [0], "source": "search",
                  "params": {"num_speculative_tokens": 4}, "goodput": [3.0, 3.2],
                  "failed": [None, None], "figures": [{"spec_acceptance_rate": 0.5},
                                                      {"spec_acceptance_rate": 0.7}]}],
        "gains": {"C1": {"ratio": 1.45, "low": 1.2, "high": 1.7}},
        "decision": {"winner": "C1", "reason": "C1's lower bound 1.20 > 1"}})
    lines = confirmation_table(study).splitlines()
    column = lines[0].index("accept")
    assert [line[column:].split()[0] for line in lines[1:3]] == ["-", "0.60"]


SCRAPE = """\
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {draft}
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}
"""


def test_a_trials_acceptance_rate_is_accepted_over_draft_tokens_of_its_window():
    before = metrics.parse(SCRAPE.format(draft=12, accepted=10))   # warm-up drafts
    after = metrics.parse(SCRAPE.format(draft=52, accepted=35))
    figures = metrics.server_figures(before, after)
    assert figures["spec_draft_tokens"] == 40 and figures["spec_accepted_tokens"] == 25
    assert figures["spec_acceptance_rate"] == pytest.approx(25 / 40)
    off = metrics.parse(SCRAPE.format(draft=0, accepted=0))
    figures = metrics.server_figures(off, off)
    assert figures["spec_draft_tokens"] == 0 and "spec_acceptance_rate" not in figures
