"""tuner.incluster.apply without a cluster: a winner let through by a minGain below 1 is
neither recommended nor applied when it measured worse than the baseline; one that
measured better is recommended (Manual); the capacity's autoscaler target joins the patch,
Auto applies it with the engine settings, records both in one annotation and rolls both
back when the verification fails."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from paged_api.contract import PREVIOUS_ENGINE
from tuner.incluster import apply as cluster_apply
from tuner.incluster.apply import apply_decision
from tuner.measure.loadgen import LoadSpec


class Run:
    def __init__(self, mode: str = "Manual", min_gain: float = 0.0) -> None:
        self.name, self.owner, self.status = "t", {}, {}
        self.spec = SimpleNamespace(min_gain=min_gain, mode=mode, target="svc", duration=3.0,
                                    capacity=None)
        self.source = SimpleNamespace(document=None)
        self.config_maps: list[str] = []
        self.live = {"metadata": {"generation": 1, "annotations": {}},
                     "spec": {"engine": {"maxNumSeqs": 1}}}
        self.cluster = SimpleNamespace(
            put_config_map=lambda name, data, owner: self.config_maps.append(name),
            get_service=lambda name: copy.deepcopy(self.live))

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


def merge(into: dict, patch: dict) -> dict:
    """RFC 7386 merge patch, as the API server applies the tuner's patches."""
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict):  # a new object too: its nulls are dropped, not kept
            if not isinstance(into.get(key), dict):
                into[key] = {}
            merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


class AutoRun(Run):
    """An Auto run on a live autoscaled service (queueDepth target 5)."""

    def __init__(self, *, verified_goodput: float) -> None:
        super().__init__("Auto", min_gain=1.0)
        self.spec = SimpleNamespace(min_gain=1.0, mode="Auto", target="svc", duration=3.0,
                                    capacity=None, startup_timeout=10, seed=0,
                                    warmup_requests=0)
        self.load, self.slos, self.prometheus = LoadSpec("chat", 3.0, 2), {}, None
        self.out_dir = Path("unused")
        self.live = {"metadata": {"generation": 1, "annotations": {}},
                     "spec": {"engine": {"maxNumSeqs": 1},
                              "autoscaling": {"maxReplicas": 3, "target": "5"}}}
        self.seen: list[dict] = []   # the live spec after each patch
        self.cluster.get_service = lambda name: copy.deepcopy(self.live)
        self.cluster.patch_service = self.patch
        self.cluster.wait_ready = lambda name, timeout, generation: None
        self.cluster.endpoint_url = lambda name: "http://svc:8000"
        self.verified_goodput = verified_goodput

    def patch(self, name: str, body: dict) -> dict:
        merge(self.live, body)
        self.live["metadata"]["generation"] += 1
        self.seen.append(copy.deepcopy(self.live))
        return copy.deepcopy(self.live)


def capacity_of(engine: dict, *, start: float) -> dict:
    assert engine == {"maxNumSeqs": 4} and start == 1.1   # C1's mean confirmation goodput
    return {"engine": engine, "ratePerReplica": 7.5,
            "autoscaling": {"metric": "queueDepth", "target": "1.5"}}


def test_the_capacity_sets_the_autoscalers_target_in_the_recommendation() -> None:
    run = Run("Manual")
    run.spec.capacity = SimpleNamespace(max_probes=2, attainment=0.9)
    apply_decision(run, record(1.4), capacity=capacity_of)
    assert run.status["capacity"]["ratePerReplica"] == 7.5
    assert run.status["recommendation"]["patch"] == {"spec": {
        "engine": {"maxNumSeqs": 4}, "autoscaling": {"target": "1.5"}}}


@pytest.mark.parametrize("verified, applied", [(5.0, "Yes"), (0.0, "RolledBack")])
def test_auto_applies_the_autoscalers_target_with_the_engine_and_rolls_both_back(
        monkeypatch, verified: float, applied: str) -> None:
    run = AutoRun(verified_goodput=verified)
    monkeypatch.setattr(cluster_apply, "measure", lambda *a, **k: {"goodput": verified})
    apply_decision(run, record(1.4), capacity=capacity_of)
    after_apply = run.seen[0]
    assert after_apply["spec"] == {"engine": {"maxNumSeqs": 4},
                                   "autoscaling": {"maxReplicas": 3, "target": "1.5"}}
    assert json.loads(after_apply["metadata"]["annotations"][PREVIOUS_ENGINE]) == {
        "engine": {"maxNumSeqs": 1}, "autoscaling": {"target": "5"}}
    assert run.status["applied"] == applied
    assert run.status["appliedAutoscaling"] == {"target": "1.5"}
    if applied == "RolledBack":   # both restored, the annotations gone
        assert run.live["spec"] == {"engine": {"maxNumSeqs": 1},
                                    "autoscaling": {"maxReplicas": 3, "target": "5"}}
        assert run.live["metadata"]["annotations"] == {}
    else:
        assert len(run.seen) == 1


def test_a_target_left_at_its_default_goes_back_to_the_default(monkeypatch) -> None:
    run = AutoRun(verified_goodput=0.0)
    del run.live["spec"]["autoscaling"]["target"]
    monkeypatch.setattr(cluster_apply, "measure", lambda *a, **k: {"goodput": 0.0})
    apply_decision(run, record(1.4), capacity=capacity_of)
    assert run.seen[0]["spec"]["autoscaling"]["target"] == "1.5"
    assert run.live["spec"]["autoscaling"] == {"maxReplicas": 3}


def test_no_autoscaler_on_the_live_service_patches_the_engine_only(monkeypatch) -> None:
    run = AutoRun(verified_goodput=5.0)
    del run.live["spec"]["autoscaling"]
    monkeypatch.setattr(cluster_apply, "measure", lambda *a, **k: {"goodput": 5.0})
    apply_decision(run, record(1.4), capacity=capacity_of)
    assert run.seen[0]["spec"] == {"engine": {"maxNumSeqs": 4}}
    assert json.loads(run.seen[0]["metadata"]["annotations"][PREVIOUS_ENGINE]) == {
        "engine": {"maxNumSeqs": 1}}


DISK = {"sizeGiB": 8, "volume": {"persistentVolumeClaim": {"claimName": "kv"}}}


def kv_record(offload: float) -> dict:
    out = record(1.4)
    out["arms"][1]["params"] = {"max_num_seqs": 4, "kv_offloading_size": offload}
    return out


@pytest.mark.parametrize("live_kv, winner, applied, previous", [
    ({"disk": DISK}, 2.0, {"offloadGiB": 2.0, "disk": DISK}, {"offloadGiB": None}),
    ({"offloadGiB": 1.0, "disk": DISK}, 4.0, {"offloadGiB": 4.0, "disk": DISK},
     {"offloadGiB": 1.0}),
    ({"offloadGiB": 1.0}, 0, {}, {"offloadGiB": 1.0}),          # the winner turns it off
    (None, 2.0, {"offloadGiB": 2.0}, None),                     # None: no spec.kvCache
])
@pytest.mark.parametrize("verified", [5.0, 0.0])
def test_auto_applies_the_host_tier_beside_the_engine_and_rolls_it_back(
        monkeypatch, live_kv, winner, applied, previous, verified) -> None:
    run = AutoRun(verified_goodput=verified)
    del run.live["spec"]["autoscaling"]
    if live_kv is not None:
        run.live["spec"]["kvCache"] = copy.deepcopy(live_kv)
    original = copy.deepcopy(run.live["spec"])
    monkeypatch.setattr(cluster_apply, "measure", lambda *a, **k: {"goodput": verified})
    apply_decision(run, kv_record(winner))
    assert run.status["recommendation"]["patch"]["spec"]["kvCache"] == {
        "offloadGiB": winner or None}
    assert run.seen[0]["spec"] == {"engine": {"maxNumSeqs": 4}, "kvCache": applied}
    assert json.loads(run.seen[0]["metadata"]["annotations"][PREVIOUS_ENGINE]) == {
        "engine": {"maxNumSeqs": 1}, "kvCache": previous}
    assert run.status["appliedKvCache"] == {"offloadGiB": winner or None}
    if verified:
        assert run.status["applied"] == "Yes" and len(run.seen) == 1
    else:   # the host tier back as it was (the disk tier kept), the annotations gone
        assert run.status["applied"] == "RolledBack"
        assert run.live["spec"] == original
        assert run.live["metadata"]["annotations"] == {}


def test_a_host_tier_the_target_already_has_is_not_patched(monkeypatch) -> None:
    run = AutoRun(verified_goodput=5.0)
    del run.live["spec"]["autoscaling"]
    run.live["spec"]["kvCache"] = {"offloadGiB": 2.0}
    monkeypatch.setattr(cluster_apply, "measure", lambda *a, **k: {"goodput": 5.0})
    apply_decision(run, kv_record(2.0))
    assert json.loads(run.seen[0]["metadata"]["annotations"][PREVIOUS_ENGINE]) == {
        "engine": {"maxNumSeqs": 1}}
    assert "appliedKvCache" not in run.status


def test_the_capacity_runs_with_the_winners_host_tier() -> None:
    run = Run("Manual")
    run.spec.capacity = SimpleNamespace(max_probes=2, attainment=0.9)
    asked = []
    apply_decision(run, kv_record(2.0), capacity=lambda engine, start, **kw: asked.append(
        (engine, kw)) or {"ratePerReplica": 1.0})
    assert asked == [({"maxNumSeqs": 4}, {"sections": {"kvCache": {"offloadGiB": 2.0}}})]
    assert run.status["best"]["kvCache"] == {"offloadGiB": 2.0}


@pytest.mark.parametrize("live_kv, winner, patched, after", [
    (None, 0, None, None),                       # off and off: no `kvCache: {}` by hand
    ({"offloadGiB": 2.0}, 2.0, None, {"offloadGiB": 2.0}),   # what the target has already
    ({"offloadGiB": 2.0, "disk": DISK}, 0, {"offloadGiB": None}, {"disk": DISK}),
    (None, 1.0, {"offloadGiB": 1.0}, {"offloadGiB": 1.0}),
])
def test_the_recommendation_patches_only_the_host_tier_it_changes(live_kv, winner, patched,
                                                                    after) -> None:
    run = Run("Manual")
    if live_kv is not None:
        run.live["spec"]["kvCache"] = copy.deepcopy(live_kv)
    apply_decision(run, kv_record(winner))
    spec = run.status["recommendation"]["patch"]["spec"]
    assert spec.get("kvCache") == patched and spec["engine"] == {"maxNumSeqs": 4}
    applied = copy.deepcopy(run.live)
    merge(applied, {"spec": spec})   # what `kubectl patch --type=merge` makes of it
    assert applied["spec"].get("kvCache") == after
