"""Two `python -m tuner sweep` workers sharing one study on a real PostgreSQL (Debian's
binaries, started by localcluster): both complete trials, none is run twice, and the
study ends with the asked number of trials."""
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from localcluster.postgres import remove_postgres_data, start_postgres

pytestmark = pytest.mark.timeout(240)
FAKE_ENGINE = f"{sys.executable} {Path(__file__).resolve().parent / 'fake_engine.py'}"


@pytest.fixture
def postgres(tmp_path):
    proc = start_postgres(tmp_path / "pg", driver="")  # plain postgresql://, as users write it
    yield proc.url
    proc.stop()
    remove_postgres_data(tmp_path / "pg")


def test_two_workers_share_one_study_without_repeating_a_trial(postgres, tmp_path):
    command = [sys.executable, "-m", "tuner", "sweep", "--workload", "chat", "--trials", "4",
               "--duration", "1", "--engine-cmd", FAKE_ENGINE, "--storage", postgres,
               "--study-name", "shared", "--remeasure", "0", "--no-progress", "--users", "2",
               "--length-scale", "0.1", "--startup-timeout", "30",
               # a continuous setting: two proposals coincide only from the same random stream
               "--param", "gpu_memory_utilization=0.5..0.95", "--param", "max_num_seqs=1..16",
               "--param", "block_size=16,32", "--param", "max_num_batched_tokens=none",
               "--param", "num_speculative_tokens=none",
               "--param", "kv_offloading_size=none"]
    workers = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=200) for w in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-2000:]
        assert "goodput" in err  # each worker ran (and printed) at least one trial
    study = optuna.load_study(study_name="shared", storage=postgres)
    trials = study.get_trials()
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert 4 <= len(done) <= 5  # workers finishing together may overshoot by one
    assert len({t.number for t in trials}) == len(trials)
    params = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(params)) == len(params), params  # no settings proposed twice
    ran = [sum(f"trial {t.number:>3} " in err for t in trials) for _, err in outputs]
    assert all(n >= 1 for n in ran) and sum(ran) == len(trials), ran
