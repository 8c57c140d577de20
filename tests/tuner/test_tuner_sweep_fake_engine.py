"""The whole search pipeline (engine subprocesses, Locust, Optuna, YAML, plots, resume) with
a stand-in engine command, so it runs in seconds; test_tuner_sweep_engine.py repeats the
essentials on the real engine, test_tuner_confirm_fake_engine.py the confirmation."""
import sys
from pathlib import Path

import optuna
import yaml

from tuner.__main__ import main
from tuner.search.report import validate_patch

FAKE_ENGINE = f"{sys.executable} {Path(__file__).resolve().parent / 'fake_engine.py'}"


def _sweep(tmp_path, trials, *extra):
    return main(["sweep", "--workload", "chat", "--trials", str(trials), "--duration", "2",
                 "--engine-cmd", FAKE_ENGINE, "--storage", f"sqlite:///{tmp_path}/s.db",
                 "--out-dir", str(tmp_path / "out"), "--users", "2", "--length-scale", "0.1",
                 "--no-progress", "--startup-timeout", "30", *extra])


def test_infeasible_trials_are_recorded_and_the_sweep_continues_then_resumes(tmp_path, capsys):
    # block_size 8 "runs out of memory" in the fake engine; 16 serves.
    args = ["--param", "block_size=8,16", "--param", "max_num_seqs=1,8",
            "--param", "gpu_memory_utilization=none", "--param", "max_num_batched_tokens=none",
            "--param", "num_speculative_tokens=none",
            "--param", "kv_offloading_size=none",
            "--remeasure", "0", "--set", "max_model_len=512"]
    for trial_params in ({"block_size": 8, "max_num_seqs": 1}, {"block_size": 16, "max_num_seqs": 1}):
        study = optuna.create_study(study_name="chat-goodput-default",
                                    storage=f"sqlite:///{tmp_path}/s.db", direction="maximize",
                                    load_if_exists=True)
        study.enqueue_trial(trial_params)  # fix the first two proposals
    assert _sweep(tmp_path, 2, *args) == 0
    out = capsys.readouterr()
    study = optuna.load_study(study_name="chat-goodput-default", storage=f"sqlite:///{tmp_path}/s.db")
    trials = study.get_trials()
    first, second = trials[0], trials[1]
    assert "out of memory" in first.user_attrs["infeasible"]
    assert first.constraints == {"engine_serves": 1.0}
    assert second.user_attrs["goodput"] > 0 and second.constraints == {"engine_serves": 0.0}
    assert second.user_attrs["server_requests"] > 0  # /metrics was scraped
    assert second.user_attrs["server_e2e_p99"] > 0
    assert len(trials) == 2  # --remeasure 0: search only, no confirmation
    assert "infeasible: out of memory" in out.err and "search (one measurement" in out.out
    assert "not confirmed against a baseline" in out.out

    text = (tmp_path / "out" / "best.yaml").read_text()
    assert text.startswith("# Unconfirmed best settings")
    patch = yaml.safe_load(text)
    assert patch == {"spec": {"engine": {"maxModelLen": 512, "blockSize": 16, "maxNumSeqs": 1}}}
    validate_patch(patch)
    for name in ("history", "pareto"):
        assert (tmp_path / "out" / f"{name}.png").stat().st_size > 1000

    # resume: asking for 3 trials runs only the missing search trial
    assert _sweep(tmp_path, 3, *args, "--remeasure", "0") == 0
    study = optuna.load_study(study_name="chat-goodput-default", storage=f"sqlite:///{tmp_path}/s.db")
    assert len(study.get_trials()) == 3

    # report rebuilds the same YAML from storage alone
    capsys.readouterr()
    assert main(["report", "--storage", f"sqlite:///{tmp_path}/s.db",
                 "--out", str(tmp_path / "again.yaml"), "--out-dir", str(tmp_path / "rep")]) == 0
    assert yaml.safe_load((tmp_path / "again.yaml").read_text())["spec"]["engine"]["blockSize"] == 16
    assert "trials" in capsys.readouterr().out


def test_pareto_objective_records_two_values(tmp_path):
    assert _sweep(tmp_path, 2, "--objective", "pareto", "--param", "block_size=16",
                  "--param", "max_num_seqs=1,16", "--param", "gpu_memory_utilization=none",
                  "--param", "max_num_batched_tokens=none",
                  "--param", "num_speculative_tokens=none",
                  "--param", "kv_offloading_size=none", "--remeasure", "0") == 0
    study = optuna.load_study(study_name="chat-pareto-default", storage=f"sqlite:///{tmp_path}/s.db")
    assert all(len(t.values) == 2 for t in study.trials)
    assert (tmp_path / "out" / "pareto.png").exists()
