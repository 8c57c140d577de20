"""The real thing: `python -m tuner sweep` on the embedded default model (CPU)."""
import subprocess
import sys

import optuna
import pytest
import yaml

from tuner.search.report import engine_schema, validate_patch

pytestmark = pytest.mark.timeout(400)


def _sweep(tmp_path, *extra):
    return subprocess.run(
        [sys.executable, "-m", "tuner", "sweep", "--workload", "chat", "--objective", "goodput",
         "--duration", "8",
         "--storage", f"sqlite:///{tmp_path}/s.db", "--out-dir", str(tmp_path / "out"),
         "--remeasure", "0", "--no-progress", "--users", "2", "--length-scale", "0.1",
         "--param", "block_size=16,32", "--param", "max_num_seqs=2..8",
         "--param", "max_num_batched_tokens=512", "--param", "gpu_memory_utilization=0.9",
         "--param", "num_speculative_tokens=4", *extra], capture_output=True, text=True, timeout=300)


def test_two_trial_sweep_writes_storage_and_a_valid_patch_and_resumes(tmp_path):
    first = _sweep(tmp_path, "--trials", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    second = _sweep(tmp_path, "--trials", "2")  # resumes: runs only trial 1
    assert second.returncode == 0, second.stderr[-2000:]
    assert "trial   0" not in second.stderr and "trial   1" in second.stderr

    study = optuna.load_study(study_name="chat-goodput-default", storage=f"sqlite:///{tmp_path}/s.db")
    assert [t.number for t in study.trials] == [0, 1]
    for trial in study.trials:
        assert trial.state == optuna.trial.TrialState.COMPLETE, trial.user_attrs
        assert trial.user_attrs["completed"] > 0
        assert trial.user_attrs["server_requests"] > 0  # server side, from /metrics
        assert "ttft_p99" in trial.user_attrs and "server_ttft_p99" in trial.user_attrs
        assert 0.0 <= trial.user_attrs["prefix_cache_hit_rate"] <= 1.0
        # speculation on (--speculative-config from the trial): its counters were read
        assert trial.user_attrs["spec_draft_tokens"] >= trial.user_attrs["spec_accepted_tokens"]

    patch = yaml.safe_load((tmp_path / "out" / "best.yaml").read_text())
    engine = patch["spec"]["engine"]
    assert engine["blockSize"] in (16, 32) and 2 <= engine["maxNumSeqs"] <= 8
    assert engine["maxNumBatchedTokens"] == 512 and engine["gpuMemoryUtilization"] == 0.9
    # (null: a merge patch removes the target's suffix keys, which n-gram refuses)
    assert {k: v for k, v in engine["speculative"].items() if v is not None} == {
        "method": "ngram", "numSpeculativeTokens": 4}
    assert validate_patch(patch) is (engine_schema() is not None)


def test_an_engine_that_cannot_start_is_infeasible_not_a_crash(tmp_path):
    result = _sweep(tmp_path, "--trials", "1", "--engine-arg=--no-such-flag")
    assert result.returncode == 1  # ran fine, but found nothing feasible to write
    assert "infeasible" in result.stderr and "--no-such-flag" in result.stderr
    study = optuna.load_study(study_name="chat-goodput-default", storage=f"sqlite:///{tmp_path}/s.db")
    assert "no-such-flag" in study.trials[0].user_attrs["infeasible"]
