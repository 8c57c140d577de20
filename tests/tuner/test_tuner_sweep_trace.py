"""`python -m tuner sweep --trace FILE --load-workers 2 --capacity` end to end on the fake
engine: the trace is replayed by a distributed Locust in every trial, the workload
document is printed and written, and the capacity of the winner is searched."""
import json
import sys
from pathlib import Path

import optuna
import pytest

from loadtests.workloads.trace import TraceRequest, write_trace
from tuner.__main__ import main

FAKE_ENGINE = f"{sys.executable} {Path(__file__).resolve().parent / 'fake_engine.py'}"
pytestmark = pytest.mark.timeout(240)


def test_sweep_replays_a_trace_with_two_load_workers_and_reports_capacity(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [TraceRequest(timestamp=i * 0.2, prompt_tokens=10, output_tokens=4,
                                     prefix_group="g0" if i % 2 else None, prefix_tokens=8)
                        for i in range(20)])
    out = tmp_path / "out"
    code = main(["sweep", "--trace", str(trace), "--trials", "1", "--duration", "2",
                 "--engine-cmd", FAKE_ENGINE, "--storage", f"sqlite:///{tmp_path}/s.db",
                 "--out-dir", str(out), "--no-progress", "--startup-timeout", "30",
                 "--param", "block_size=16", "--param", "max_num_seqs=2",
                 "--param", "gpu_memory_utilization=none",
                 "--param", "max_num_batched_tokens=none",
                 "--param", "num_speculative_tokens=none", "--remeasure", "0",
                 "--load-workers", "2", "--capacity", "2", "--slo", "ttft=1.0"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "inferred:" in printed and "assumed:" in printed and "capacity:" in printed
    assert "10 of 20 requests" in (out / "workload.md").read_text()
    study = optuna.load_study(study_name="trace-goodput-default",
                              storage=f"sqlite:///{tmp_path}/s.db")
    trial = study.trials[0]
    # 2 s of a 5 req/s trace (split over 2 workers): ~10 requests, the last at the edge
    assert 8 <= trial.user_attrs["requests"] <= 11
    capacity = json.loads((out / "capacity.json").read_text())
    assert capacity["rate_per_replica"] > 0 and len(capacity["probes"]) == 2


def test_one_workload_source_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--trials", "1"])
    assert exit_info.value.code == 2
    assert "give exactly one of --workload, --trace" in capsys.readouterr().err
