"""tuner.cluster_apply's decision guard, without a cluster: a winner let through by a
minGain below 1 is neither recommended nor applied when it measured worse than the
baseline; one that measured better is recommended (Manual)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuner.cluster_apply import apply_decision


class Run:
    def __init__(self, mode: str = "Manual", min_gain: float = 0.0) -> None:
        self.name, self.owner, self.status = "t", {}, {}
        self.spec = SimpleNamespace(min_gain=min_gain, mode=mode, target="svc")
        self.config_maps: list[str] = []
        self.cluster = SimpleNamespace(
            put_config_map=lambda name, data, owner: self.config_maps.append(name))

    def publish(self, **fields) -> None:
        self.status.update(fields)


def record(ratio: float) -> dict:
    arm = {"params": {"max_num_seqs": 4}, "goodput": [1.0, 1.2], "failed": [None, None]}
    return {"arms": [{**arm, "label": "baseline", "params": {"max_num_seqs": 1}},
                     {**arm, "label": "C1"}],
            "gains": {"C1": {"ratio": ratio, "low": 0.3, "high": 3.0, "rounds": 2}},
            "decision": {"winner": "C1", "reason": "C1: lower bound above 0"}}


@pytest.mark.parametrize("mode", ["Manual", "Auto"])
def test_a_winner_that_measured_worse_is_not_recommended(mode: str) -> None:
    run = Run(mode)
    apply_decision(run, record(0.85))
    assert run.status["applied"] == "No" and run.status["phase"] == "Succeeded"
    assert run.status["decision"]["winner"] is None
    assert "C1 measured no better than the baseline: gain 0.85x" in \
        run.status["decision"]["reason"]
    assert run.status["gain"]["ratio"] == 0.85   # the figures are still reported
    assert run.config_maps == []


def test_a_winner_that_measured_better_is_recommended() -> None:
    run = Run("Manual")
    apply_decision(run, record(1.4))
    assert run.status["applied"] == "Manual" and run.status["decision"]["winner"] == "C1"
    assert run.status["recommendation"]["patch"] == {"spec": {"engine": {"maxNumSeqs": 4}}}
    assert run.config_maps == ["t-recommendation"]
