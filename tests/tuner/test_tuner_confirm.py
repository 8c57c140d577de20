"""The confirmation loop (tuner.search.confirm) with a simulated engine: known goodput per
setting, known noise, no processes; and --baseline files."""
import math
import random

import optuna
import pytest
import yaml

from tuner.search.confirm import load_baseline, run_confirmation
from tuner.search.report import engine_patch, result_line
from tuner.measure.runner import Infeasible

# true goodput by the settings a runner is asked to start ({}: the engine's defaults)
TRUE = {"max_num_seqs=4": 15.0, "max_num_seqs=2": 10.0, "": 10.0}


def _key(settings: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items()))


class _Runner:
    """A TrialRunner (tuner/measure/runner.py) around `measure(settings, seed, workdir)`."""

    def __init__(self, measure):
        self.measure = measure

    def run(self, request):
        return self.measure(request.settings, request.seed, request.workdir)


def _study(search: dict[int, float]) -> optuna.Study:
    """An in-memory study whose search measured max_num_seqs=K at the given goodput."""
    study = optuna.create_study(direction="maximize")
    dist = {"max_num_seqs": optuna.distributions.IntDistribution(1, 64)}
    for seqs, goodput in search.items():
        study.add_trial(optuna.trial.create_trial(params={"max_num_seqs": seqs}, distributions=dist,
                                                  value=goodput, user_attrs={"goodput": goodput}))
    return study


def _confirm(study, rounds, *, measure, k=2, tmp_path):
    baseline = load_baseline(None, fixed={}, searched=["max_num_seqs"])
    return run_confirmation(study, baseline=baseline, k=k, rounds=rounds, seed=0, floor=0.05,
                            out_dir=tmp_path, fixed={}, runner=_Runner(measure),
                            log=lambda s: None)


def _simulated(order: list, sigma: float = 0.05, seed: int = 0):
    rng = random.Random(seed)

    def measure(settings, load_seed, workdir):
        order.append((workdir.parent.name, workdir.name, load_seed))
        return {"goodput": TRUE[_key(settings)] * math.exp(rng.gauss(0, sigma)),
                "ttft_p99": 0.5, "device": "cpu, 1 torch threads"}
    return measure


def test_a_truly_better_setting_wins_with_its_interval_above_1(tmp_path):
    # the search saw max_num_seqs=2 as best (lucky); in truth 4 is 1.5x the baseline
    study = _study({2: 14.0, 4: 12.0})
    order = []
    record = _confirm(study, 3, measure=_simulated(order), tmp_path=tmp_path)
    assert [a["params"] for a in record["arms"]] == [{"max_num_seqs": 256}, {"max_num_seqs": 2},
                                                     {"max_num_seqs": 4}]
    # interleaved, rotated each round, one request stream per round shared by all arms
    assert [(r, a) for r, a, _ in order] == [
        ("round-0", "baseline"), ("round-0", "C1"), ("round-0", "C2"),
        ("round-1", "C1"), ("round-1", "C2"), ("round-1", "baseline"),
        ("round-2", "C2"), ("round-2", "baseline"), ("round-2", "C1")]
    assert [s for _, _, s in order] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert record["decision"]["winner"] == "C2"
    gain = record["gains"]["C2"]
    assert 1.0 < gain["low"] < 1.5 < gain["high"]
    assert record["gains"]["C1"]["low"] < 1.0
    assert engine_patch(study) == {"spec": {"engine": {"maxNumSeqs": 4}}}
    assert "gain 1.5" in result_line(study) or "gain 1.4" in result_line(study)


def test_a_setting_better_only_by_noise_is_not_applied_and_the_baseline_stays(tmp_path):
    study = _study({2: 25.0})  # one lucky search measurement; in truth equal to the baseline
    record = _confirm(study, 3, measure=_simulated([]), k=1, tmp_path=tmp_path)
    assert record["decision"]["winner"] is None
    assert record["decision"]["reason"].startswith("no significant gain over the baseline")
    assert engine_patch(study) == {"spec": {"engine": {"maxNumSeqs": 256}}}  # the defaults
    assert "keeping the baseline" in result_line(study)


def test_a_candidate_that_fails_a_round_is_disqualified(tmp_path):
    study = _study({4: 14.0})

    def measure(settings, seed, workdir):
        if settings and seed == 2:
            raise Infeasible("out of memory")
        return {"goodput": TRUE[_key(settings)]}
    record = _confirm(study, 3, measure=measure, k=1, tmp_path=tmp_path)
    assert record["gains"]["C1"] is None and record["decision"]["winner"] is None
    assert record["arms"][1]["failed"] == [None, "out of memory", None]


def test_an_interrupted_confirmation_resumes_and_more_rounds_extend_it(tmp_path):
    study = _study({4: 14.0})
    calls = []

    def interrupted(settings, seed, workdir):
        if len(calls) == 3:  # round 1's first measurement
            raise KeyboardInterrupt
        calls.append(seed)
        return {"goodput": TRUE[_key(settings)]}
    with pytest.raises(KeyboardInterrupt):
        _confirm(study, 3, measure=interrupted, k=1, tmp_path=tmp_path)
    assert study.user_attrs["confirmation"]["rounds"] == 1
    order = []
    _confirm(study, 3, measure=_simulated(order), k=1, tmp_path=tmp_path)
    assert [s for _, _, s in order] == [2, 2, 3, 3]  # rounds 1 and 2 only
    order.clear()
    record = _confirm(study, 5, measure=_simulated(order), k=1, tmp_path=tmp_path)
    assert [s for _, _, s in order] == [4, 4, 5, 5] and len(record["arms"][0]["goodput"]) == 5


def test_baseline_file_forms_and_errors(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump({"spec": {"engine": {"maxNumSeqs": 16, "blockSize": 32}}},
                                   sort_keys=False))
    b = load_baseline(str(path), fixed={"max_model_len": 512}, searched=["max_num_seqs"])
    assert b.params == {"max_model_len": 512, "max_num_seqs": 16, "block_size": 32}
    assert b.settings == {"max_model_len": 512, "max_num_seqs": 16, "block_size": 32}
    path.write_text("engine: {enablePrefixCaching: false}")
    assert load_baseline(str(path), fixed={}, searched=[]).settings == {
        "enable_prefix_caching": False}
    for text, words in (("spec: {engine: {pageSize: 16}}", "unknown engine setting 'pageSize'"),
                        ("[1, 2]", "expected a spec.engine mapping"),
                        ("maxNumSeqs: lots", "'lots' is not a valid int")):
        path.write_text(text)
        with pytest.raises(ValueError, match=words):
            load_baseline(str(path), fixed={}, searched=[])
    with pytest.raises(ValueError, match="No such file"):
        load_baseline(str(tmp_path / "none.yaml"), fixed={}, searched=[])
