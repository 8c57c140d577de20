"""`python -m tuner sweep` with its confirmation, end to end (engine processes, Locust,
Optuna, YAML, plots, report) on the stand-in engine of tests/tuner/fake_engine.py with a
known speed per setting and known noise."""
import json
import sys
from pathlib import Path

import optuna
import yaml

from tuner.__main__ import main

FAKE_ENGINE = f"{sys.executable} {Path(__file__).resolve().parent / 'fake_engine.py'}"
SPACE = ["--param", "max_num_seqs=2,4", "--param", "block_size=none",
         "--param", "gpu_memory_utilization=none", "--param", "max_num_batched_tokens=none",
         "--param", "num_speculative_tokens=none",
         "--param", "kv_offloading_size=none"]


def _sweep(tmp_path, monkeypatch, *, itl: dict, noise: float, first: int, rounds: int,
           lucky: int | None = None):
    monkeypatch.setenv("FAKE_ENGINE_ITL", json.dumps(itl))
    monkeypatch.setenv("FAKE_ENGINE_NOISE", str(noise))
    monkeypatch.setenv("FAKE_ENGINE_STATE", str(tmp_path / "state"))
    if lucky is not None:
        monkeypatch.setenv("FAKE_ENGINE_LUCKY", str(lucky))
    storage = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="chat-goodput-default", storage=storage,
                        direction="maximize").enqueue_trial({"max_num_seqs": first})
    code = main(["sweep", "--workload", "chat", "--trials", "1", "--duration", "3",
                 "--engine-cmd", FAKE_ENGINE, "--storage", storage, "--out-dir",
                 str(tmp_path / "out"), "--users", "2", "--length-scale", "0.1",
                 "--no-progress", "--startup-timeout", "30", "--remeasure", "1",
                 "--confirm-rounds", str(rounds), *SPACE])
    return code, optuna.load_study(study_name="chat-goodput-default", storage=storage)


def test_a_truly_better_setting_is_applied_with_its_gain_and_interval(tmp_path, monkeypatch,
                                                                      capsys):
    # max_num_seqs=4 streams tokens 4x faster than the defaults (256), 10 % noise per engine
    code, study = _sweep(tmp_path, monkeypatch, itl={"4": 0.01, "*": 0.04}, noise=0.1,
                         first=4, rounds=3)
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    record = study.user_attrs["confirmation"]
    assert [a["label"] for a in record["arms"]] == ["baseline", "C1"]
    assert record["arms"][0]["source"] == "engine defaults" and record["arms"][0]["settings"] == {}
    assert record["arms"][1]["settings"] == {"max_num_seqs": 4}
    assert record["decision"]["winner"] == "C1"
    gain = record["gains"]["C1"]
    assert gain["low"] > 1 and gain["rounds"] == 3  # true gain ~3x: low ~1.6 measured
    assert out.err.count("round 3/3") == 2  # both arms measured in round 3

    text = (tmp_path / "out" / "best.yaml").read_text()
    assert yaml.safe_load(text) == {"spec": {"engine": {"maxNumSeqs": 4}}}
    header = text.split("spec:")[0]
    for words in ("workload chat", "2 users (closed loop)", "chat ttft<=1s, tpot<=0.1s",
                  "model embedded tiny model", "baseline (engine defaults)", "winner C1",
                  "95% interval", "over 3 interleaved rounds"):
        assert words in " ".join(header.replace("# ", "").split()), (words, header)
    # the main job's printout: baseline, winner, gain and interval
    result = next(line for line in out.out.splitlines() if line.startswith("result: "))
    assert f"gain {gain['ratio']:.2f}x, 95% interval [{gain['low']:.2f}, {gain['high']:.2f}]" \
        in result and "baseline (engine defaults)" in result
    assert "C1" in out.out and "1 (reference)" in out.out  # the confirmation table
    for name in ("history", "pareto"):
        assert (tmp_path / "out" / f"{name}.png").stat().st_size > 1000

    # report rebuilds the same decision from storage alone
    assert main(["report", "--storage", f"sqlite:///{tmp_path}/s.db", "--out",
                 str(tmp_path / "again.yaml"), "--out-dir", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "again.yaml").read_text() == text


def test_a_setting_better_only_by_noise_is_not_applied(tmp_path, monkeypatch, capsys):
    # max_num_seqs=2 is 4x faster on its first start only (the search's lucky run) and in
    # truth a little slower than the defaults: confirmation must keep the baseline
    code, study = _sweep(tmp_path, monkeypatch, itl={"2": 0.022, "*": 0.02}, noise=0.0,
                         first=2, rounds=2, lucky=2)
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    search = study.trials[0].user_attrs["goodput"]
    record = study.user_attrs["confirmation"]
    assert search > 2 * max(record["arms"][1]["goodput"])  # the lucky search measurement
    assert record["decision"]["winner"] is None
    assert "no significant gain over the baseline" in out.out
    text = (tmp_path / "out" / "best.yaml").read_text()
    assert text.startswith("# Baseline settings kept")
    assert yaml.safe_load(text)["spec"]["engine"] == {"maxNumSeqs": 256}  # the defaults
