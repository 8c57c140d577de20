"""The one search loop (tuner/search/loop.py) over a TrialRunner that records its requests:
what a runner is handed (settings by engine-settings name, never flags), and how each kind
of result is told to the study. The same loop runs the local sweep (tests of
tuner.search.sweep) and the in-cluster Job (test_tuner_cluster_pods.py)."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from paged_api.contract import search_space
from tuner.incluster.service_runner import ServiceRunner, service_name
from tuner.measure.loadgen import LoadError, LoadSpec
from tuner.measure.runner import Infeasible, TrialRequest
from tuner.search.loop import run_search
from paged_api.search_space import parse_param


class Recorder:
    """A TrialRunner whose result for each max_num_seqs value is scripted."""

    def __init__(self, results: dict) -> None:
        self.results, self.requests = results, []

    def run(self, request: TrialRequest) -> dict[str, float]:
        self.requests.append(request)
        result = self.results[request.settings["max_num_seqs"]]
        if isinstance(result, Exception):
            raise result
        if callable(result):
            return result(request)
        return {"goodput": result, "throughput": result + 1, "ttft_p99": 0.5}


def _study() -> optuna.Study:
    return optuna.create_study(direction="maximize",
                               sampler=optuna.samplers.RandomSampler(seed=0))


def _queue(study: optuna.Study, *values: int) -> None:
    for value in values:
        study.enqueue_trial({"max_num_seqs": value})


def test_each_kind_of_result_is_told_and_the_runner_gets_settings(tmp_path: Path) -> None:
    space = [parse_param("max_num_seqs", [2, 4, 8, 512])]
    runner = Recorder({2: 3.0, 4: Infeasible("out of memory"), 8: LoadError("locust died")})
    study = _study()
    _queue(study, 2, 4, 8, 512)
    seen = []
    run_search(study, space, runner, total=4, workdir=tmp_path, seed=7,
               fixed={"max_num_batched_tokens": 256, "block_size": 16},
               on_result=lambda trial, outcome: seen.append((trial.number, outcome)))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE,
                                         TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].value == 3.0 and trials[0].user_attrs["goodput"] == 3.0
    assert trials[1].value == 0.0 and trials[1].user_attrs["infeasible"] == "out of memory"
    assert trials[2].user_attrs["failed"] == "locust died"
    # 512 sequences > 256 batched tokens breaks the settings table's rule: infeasible
    # without starting anything, with the rule's own words
    assert "max_num_batched_tokens (256) must be >= max_num_seqs (512)" in \
        trials[3].user_attrs["infeasible"]
    assert [r.settings["max_num_seqs"] for r in runner.requests] == [2, 4, 8]
    first = runner.requests[0]
    assert first.settings == {"max_num_batched_tokens": 256, "block_size": 16, "max_num_seqs": 2}
    assert (first.name, first.seed, first.workdir) == ("trial-0000", 7, tmp_path / "trial-0000")
    assert first.on_progress is None   # pruning off
    assert [n for n, _ in seen] == [0, 1, 2, 3]
    assert seen[1][1].infeasible == "out of memory" and seen[2][1].failed == "locust died"


def test_the_loop_stops_at_the_total_counting_trials_already_in_the_study(tmp_path) -> None:
    space = [parse_param("max_num_seqs", [2, 4])]
    runner = Recorder({2: 1.0, 4: 2.0})
    study = _study()
    run_search(study, space, runner, total=3, workdir=tmp_path)
    assert len(runner.requests) == 3
    run_search(study, space, runner, total=5, workdir=tmp_path)   # resumed: 2 more
    assert len(runner.requests) == 5 and len(study.trials) == 5
    with_parallel = _study()
    run_search(with_parallel, space, runner, total=3, workdir=tmp_path, parallelism=2)
    assert len(with_parallel.trials) == 3   # a batch of 2, then a batch of 1


def test_a_trial_behind_earlier_ones_is_pruned_only_with_pruning_on(tmp_path) -> None:
    def slow(request: TrialRequest) -> dict:
        stopped = [request.on_progress(float(step), 0.1) for step in range(20)]
        assert any(stopped)   # the pruner asked the measurement to stop
        return {"goodput": 0.1, "throughput": 0.1}

    def fast(request: TrialRequest) -> dict:
        if request.on_progress is not None:
            for step in range(20):
                assert not request.on_progress(float(step), 5.0)
        return {"goodput": 5.0, "throughput": 5.0}

    space = [parse_param("max_num_seqs", [2, 4])]
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(
        n_startup_trials=2, n_warmup_steps=0))
    _queue(study, 4, 4, 2)
    run_search(study, space, Recorder({2: slow, 4: fast}), total=3, workdir=tmp_path,
               prune=True)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE,
                                              TrialState.PRUNED]
    unpruned = optuna.create_study(direction="maximize")
    _queue(unpruned, 4, 4)
    run_search(unpruned, space, Recorder({4: fast}), total=2, workdir=tmp_path)
    assert all(t.state == TrialState.COMPLETE for t in unpruned.trials)


def test_pareto_tells_throughput_and_the_primary_p99(tmp_path) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    _queue(study, 2)
    run_search(study, [parse_param("max_num_seqs", [2])], Recorder({2: 3.0}), total=1,
               workdir=tmp_path, objective="pareto", primary_latency="ttft")
    assert study.trials[0].values == [4.0, 0.5]


class FakeCluster:
    """Records the trial services the runner writes (the local-cluster tests run real ones)."""

    def __init__(self) -> None:
        self.created, self.deleted = [], []
        self.stopping = type("Never", (), {"is_set": staticmethod(lambda: False)})()

    def create_trial(self, name, target, engine, owner):
        self.created.append((name, engine, owner))

    def wait_ready(self, name, timeout):
        raise Infeasible("Degraded: engine out of memory")

    def delete_service(self, name, wait=False):
        self.deleted.append(name)


def test_the_service_runner_writes_settings_as_spec_engine_and_deletes_the_trial(tmp_path):
    cluster = FakeCluster()
    target = {"spec": {"engine": {"blockSize": 32, "maxNumSeqs": 64, "cpuThreads": 2}}}
    runner = ServiceRunner(cluster, "tune", {"uid": "u"}, target, LoadSpec(workload="chat", duration=1, users=1),
                           {}, startup_timeout=5)
    request = TrialRequest(name="trial-0003", seed=0, workdir=tmp_path,
                           settings={"max_num_seqs": 8, "gpu_memory_utilization": 0.85,
                                     "enable_prefix_caching": False})
    with pytest.raises(Infeasible, match="out of memory"):
        runner.run(request)
    # the target's own settings stay unless the trial sets them; CRD keys and types
    assert cluster.created == [("tune-t3", {"blockSize": 32, "maxNumSeqs": 8, "cpuThreads": 2,
                                            "gpuMemoryUtilization": 0.85,
                                            "enablePrefixCaching": False}, {"uid": "u"})]
    assert cluster.deleted == ["tune-t3"]   # deleted even when it never turned Ready
    assert service_name("tune", "round-2-C1") == "tune-r2-c1"
    assert service_name("tune", "round-0-baseline") == "tune-r0-baseline"
    with pytest.raises(ValueError, match="no trial service name"):
        service_name("tune", "capacity")


def test_the_contract_parses_the_search_space_into_the_loops_params() -> None:
    space = search_space({"maxNumSeqs": {"min": 2, "max": 64, "log": True}, "blockSize": [16]})
    assert [(p.name, p.low, p.high, p.log, p.choices) for p in space] == [
        ("max_num_seqs", 2, 64, True, None), ("block_size", None, None, False, (16,))]
