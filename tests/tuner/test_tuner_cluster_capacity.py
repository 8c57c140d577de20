"""spec.objective Capacity without a cluster: the spec's rules; the pieces the Job's
capacity sweep adds to tuner/search/capacity_sweep.py (a profile timed by the pilot alone;
the simulated pools sized from the pilot's: tests/tuner/test_capacity_pool.py); the
simulator's base settings from the target's spec; the verification probe.
End to end in a cluster: tests/local_cluster/test_tuning_real_engine.py."""
from __future__ import annotations

import dataclasses
import json

import pytest

import tuner.search.capacity_sweep as cs
from paged_api.contract import parse_tuning, spec_error
from tuner.incluster import capacity_job
from tuner.sim.calibrate import config_profile
from tuner.sim.profile import UNFITTED, Fit

from test_capacity_sweep import FakeSim, _config, _real, _steps_law  # noqa: F401

BASE = {"targetRef": {"name": "svc"}}
CPU_TARGET = {"model": {"uri": "builtin://default"}, "engine": {"maxNumSeqs": 4},
              "resources": {"gpus": 0, "memory": "1Gi"}}


def test_the_objective_defaults_to_goodput_and_capacity_is_parsed():
    assert parse_tuning(BASE).objective == "Goodput"
    assert parse_tuning({**BASE, "objective": "Capacity"}).objective == "Capacity"


@pytest.mark.parametrize("fields, message", [
    ({"objective": "capacity"}, "spec.objective: 'capacity' is not Goodput or Capacity"),
    ({"objective": "Capacity", "rate": 2.0}, "spec.rate: the Capacity objective searches"),
    ({"objective": "Capacity", "tunerPods": 2, "storage": {"secretRef": {"name": "db"}}},
     "spec.tunerPods: the Capacity objective searches on the simulator in one pod"),
])
def test_a_capacity_spec_no_job_can_run_names_its_field(fields, message):
    assert message in spec_error({**BASE, **fields})
    # the same fields under the goodput loop are fine (one pod with storage is too)
    goodput = {**fields, "objective": "Goodput"}
    assert spec_error({**BASE, **goodput}) is None


def test_the_simulators_base_is_the_targets_engine_and_its_cpu_memory():
    base = capacity_job.simulator_base(CPU_TARGET)
    assert base["max_num_seqs"] == 4 and base["block_size"] == 16   # the CRD's default
    assert base["cpu_memory_gib"] == pytest.approx(0.25)   # 1 GiB less the runtime
    gpu = capacity_job.simulator_base({**CPU_TARGET, "resources": {"gpus": 1}})
    assert "cpu_memory_gib" not in gpu and gpu["max_num_seqs"] == 4
    assert not {"kv_offloading_size", "kv_disk_dir", "kv_disk_size"} & set(base)
    # its KV tiers are the simulated twin's too (tuner/sim/tiers.py), as the engine's flags
    tiered = {**CPU_TARGET, "kvCache": {"offloadGiB": 2, "disk": {
        "sizeGiB": 10, "volume": {"emptyDir": {}}}}}
    base = capacity_job.simulator_base(tiered)
    assert (base["kv_offloading_size"], base["kv_disk_dir"], base["kv_disk_size"]) == \
        (2, "/kv-cache", 10)
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    from tuner.sim.engine import sim_engine
    engine, _ = sim_engine(config_profile("builtin://default", 1), base,
                           hf_config=AutoConfig.from_pretrained(resolve_model_path(None)))
    assert engine.offload.disk is not None and engine.offload.host.capacity_bytes == 2 * 2**30
    off = capacity_job.simulator_base({**CPU_TARGET, "kvCache": {"offloadGiB": 0}})
    assert "kv_offloading_size" not in off


def _unfitted() -> FakeSim:
    sim = FakeSim()
    sim.profile = dataclasses.replace(sim.profile, fit=Fit(UNFITTED, {}, float("inf")))
    sim.calibration = sim.profile
    return sim


def test_a_profile_that_times_nothing_is_timed_by_the_pilot_alone(tmp_path, monkeypatch):
    calls = _real(monkeypatch)
    monkeypatch.setattr(cs, "read_steps", lambda url, series, interval: (
        _steps_law(series), lambda: None)[1])
    monkeypatch.setattr(cs, "pool_blocks", lambda url: 500)
    measure = cs.measure_capacity
    monkeypatch.setattr(cs, "measure_capacity", lambda *a, watch=None, **k: (
        watch and watch("http://engine:8000")(), measure(*a, **k))[1])
    sim = _unfitted()
    plan = cs.CapacityPlan(sim=sim, sim_base={"cpu_memory_gib": 0.5}, trials=4,
                           real_probes=4, log=lambda s: None, pilot_start=3.0,
                           pool_from_pilot=True)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    # the pilot started at pilot_start, bracketing widely; nothing was simulated before it
    assert calls[0]["start"] == 3.0 and calls[0]["growth"] == 2.0
    assert sim.fits and all(f.form != UNFITTED for f in sim.fits)
    assert record["profile"]["source"] == "live (the pilot's steps)"
    assert record["profile"]["check"] is None   # nothing to compare the refit with
    # the pool: the activations at the baseline's limits (8 sequences) are what 500
    # blocks of its 16 tokens and the 1 MB of weights leave of 0.9 x 0.5 GiB
    memory = plan.sim.profile.memory
    at = dict(max_num_batched_tokens=8192, max_num_seqs=8)
    assert memory.activations(**at) == pytest.approx(0.9 * 0.5 * 2**30 - 1e6 - 500 * 16 * 1000)
    assert memory.weight_bytes == 1e6
    assert memory.num_blocks(block_size=16, fraction=0.9, cpu_memory_gib=0.5, **at) == 500
    # 248 more sequences' logits (100-token vocabulary, float32): 6.2 blocks' bytes, 7 blocks
    assert memory.num_blocks(block_size=16, fraction=0.9, max_num_batched_tokens=8192,
                             max_num_seqs=256, cpu_memory_gib=0.5) == 500 - 7


def test_a_pilot_too_short_to_time_fails_naming_the_trial_duration(tmp_path, monkeypatch):
    _real(monkeypatch)
    monkeypatch.setattr(cs, "read_steps", lambda url, series, interval: lambda: None)
    measure = cs.measure_capacity
    monkeypatch.setattr(cs, "measure_capacity", lambda *a, watch=None, **k: (
        watch and watch("http://engine:8000")(), measure(*a, **k))[1])
    plan = cs.CapacityPlan(sim=_unfitted(), sim_base={}, trials=4, log=lambda s: None)
    with pytest.raises(ValueError, match="lengthen the trials' load .trialDuration."):
        cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)


@pytest.mark.timeout(240)
def test_the_verification_probe_holds_below_the_knee_and_not_above(tmp_path, monkeypatch):
    """The live service is the fake engine taking 10.5 req/s (tests/tuner/
    test_tuner_capacity.py's knee); the probe runs at the baseline's median real capacity
    times the winner's lower bound."""
    from types import SimpleNamespace

    from loadtests.workloads.trace import TraceRequest, write_trace
    from tuner.measure.loadgen import LoadSpec
    from tuner.measure.local import EngineLaunch
    from test_tuner_capacity import FAKE_ENGINE

    monkeypatch.setenv("FAKE_ENGINE_SLOTS", "1")
    monkeypatch.setenv("FAKE_ENGINE_ITL", json.dumps({"2": 0.02}))
    trace = tmp_path / "even.jsonl"
    write_trace(trace, [TraceRequest(timestamp=i / 10, prompt_tokens=8, output_tokens=10)
                        for i in range(300)])
    engine = EngineLaunch(engine_cmd=FAKE_ENGINE, startup_timeout=30).process(
        {"max_num_seqs": 2}, tmp_path / "engine.log")
    engine.start(timeout=30)
    try:
        run = SimpleNamespace(
            cluster=SimpleNamespace(endpoint_url=lambda name: engine.url),
            spec=SimpleNamespace(target="svc", capacity=None, duration=3.0,
                                 warmup_requests=0),
            load=LoadSpec(workload="trace", trace=str(trace), duration=3, users=1,
                          arrival="open"),
            slos={"trace": {"ttft": 0.25}}, source=SimpleNamespace(trace_rate=10.0),
            prometheus=None, out_dir=tmp_path)
        record = {"arms": [{"capacity": [4.0, 5.0, 6.0], "failed": [None, "x", None]}],
                  "gains": {"C1": {"low": 1.2}}, "winner": "C1"}
        held = capacity_job.verify_capacity(run, record)   # at 5 x 1.2 = 6 req/s
        assert held["rate"] == pytest.approx(6.0) and held["baselineCapacity"] == 5.0
        assert held["held"] is True and held["attainment"] >= 0.9, held
        record["gains"]["C1"]["low"] = 0.5   # a lower bound under 1: the baseline's rate
        assert capacity_job.verify_capacity(run, record)["rate"] == pytest.approx(5.0)
        record["gains"]["C1"]["low"] = 4.0                  # at 20 req/s: past the knee
        missed = capacity_job.verify_capacity(run, record)
        assert missed["rate"] == pytest.approx(20.0)
        assert missed["held"] is False and missed["attainment"] < 0.9, missed
        assert "queue grew" not in missed["message"]
        # the share needed is spec.capacity.attainment's: a quarter of it met; yet an
        # overloaded pod's queue grows (capacity.probe_verdict), so it still does not hold
        run.spec.capacity = SimpleNamespace(attainment=missed["attainment"] / 4,
                                            sustain_seconds=60.0)
        queued = capacity_job.verify_capacity(run, record)
        assert queued["held"] is False and queued["attainment"] >= missed["attainment"] / 4
        assert "their queue grew faster than the pod holds for 60 s" in queued["message"]
    finally:
        engine.stop()


def test_the_status_shows_the_simulated_search_and_the_step_times_factor():
    record = {"simulated": [
        {"params": {"max_num_seqs": 8}, "capacity": 9.0},
        {"params": {"max_num_seqs": 8}, "capacity": 9.0},   # proposed twice, shown once
        {"params": {"max_num_seqs": 2}, "capacity": 4.0},
        {"params": {"block_size": 7}, "capacity": None}],
        "sim_wall_s": 1.234, "sim_baseline": 3.0,
        "profile": {"form": "tokens", "source": "live (the pilot's steps)",
                    "heldout_error": 0.2, "check": None, "pool": None,
                    "anchor": {"pilot": 3.0, "simulated": 6.0, "factor": 2.1,
                               "anchored": 3.1, "simulations": 2,
                               "tried": [[1.0, 6.0], [2.0, 3.2], [2.1, 3.1]]}}}
    simulation = capacity_job.simulated_status(record)["simulation"]
    assert simulation["settings"] == 4 and simulation["infeasible"] == 1
    assert [p["capacity"] for p in simulation["best"]] == [9.0, 4.0]
    assert simulation["best"][0]["engine"] == {"maxNumSeqs": 8}
    assert simulation["profile"] == {
        "form": "tokens", "source": "live (the pilot's steps)", "heldoutError": 0.2,
        "anchor": {"factor": 2.1, "pilotCapacity": 3.0, "simulatedBefore": 6.0,
                   "tried": [[1.0, 6.0], [2.0, 3.2], [2.1, 3.1]]}}
    record["profile"]["anchor"] = None
    assert "anchor" not in capacity_job.simulated_status(record)["simulation"]["profile"]


def test_the_status_shows_the_pilot_against_the_baselines_rounds_and_warns_on_drift():
    import tuner.search.capacity_sweep as sweep

    base = {"capacity": [45.0, 40.6, 44.0], "failed": [None, None, None]}
    pilot = {"capacity": 22.47, "failed": None}
    record = {"pilot": pilot, "pilot_drift": sweep.pilot_drift(pilot, base)}
    status = capacity_job.pilot_status(record)
    assert status["capacity"] == 22.47 and status["ofBaselineRounds"] == round(22.47 / 44, 4)
    assert status["warning"].startswith("the pilot read 0.51x the baseline's rounds")
    record["pilot"] = {"capacity": 43.0, "failed": None}
    record["pilot_drift"] = sweep.pilot_drift(record["pilot"], base)
    assert "warning" not in capacity_job.pilot_status(record)
    # no rounds (no headroom in simulation) or a failed pilot: its capacity alone
    assert capacity_job.pilot_status({"pilot": {"capacity": 0.0, "failed": "refused"},
                                      "pilot_drift": None}) == {"capacity": 0.0,
                                                                "failed": "refused"}


def _probe(rate: float, passed: bool, waiting: float) -> dict:
    return {"rate": rate, "passed": passed, "attainment": 0.95 if passed else 0.5,
            "gauges": {"num_requests_waiting_mean": waiting,
                       "kv_cache_usage_perc_mean": waiting / 10}}


def _capacity_record() -> dict:
    """Four rounds of a baseline and a winner C1 (the fourth C1 failed to start): C1's
    queue at its highest passing probe was 1.4, 1.0 and 2.0."""
    c1 = {"label": "C1", "params": {"max_num_seqs": 8}, "capacity": [9.0, 7.0, 6.0, 0.0],
          "failed": [None, None, None, "did not start"],
          "probes": [[_probe(4, True, 0.2), _probe(8, True, 1.4), _probe(16, False, 9.0)],
                     [_probe(6, True, 1.0), _probe(12, False, 5.0)],
                     [_probe(5, True, 2.0), _probe(3, True, 0.1)], []]}
    base = {"label": "baseline", "params": {"max_num_seqs": 1}, "capacity": [3.0, 2.0, 2.5, 3],
            "failed": [None] * 4,
            "probes": [[_probe(2, True, 0.3), _probe(3, True, 0.6)]] * 4}
    return {"arms": [base, c1], "winner": "C1",
            "gains": {"C1": {"ratio": 3.0, "low": 1.5, "high": 5.0, "rounds": 3}},
            "decision": {"winner": "C1", "reason": "C1: lower bound above 1"},
            "figure": "capacity"}


def test_the_autoscalers_target_is_the_winners_queue_at_its_capacity():
    record = _capacity_record()
    found = capacity_job.capacity_status(record, 0.9, autoscaling={"maxReplicas": 3})
    assert found["ratePerReplica"] == 7.0 and found["rounds"] == 3
    assert found["autoscaling"] == {"metric": "queueDepth", "target": "1.4", "measured": 1.4}
    kv = capacity_job.capacity_status(record, 0.9, autoscaling={"metric": "kvCacheUsage",
                                                                "maxReplicas": 3})
    assert kv["autoscaling"]["target"] == "0.14"
    baseline = capacity_job.capacity_status(record, 0.9, label="baseline",
                                            autoscaling={"maxReplicas": 3})
    assert baseline["autoscaling"]["measured"] == 0.6 and baseline["ratePerReplica"] == 2.75
    # the SLO planner sizes replicas itself; no autoscaler, no target
    assert "autoscaling" not in capacity_job.capacity_status(
        record, 0.9, autoscaling={"mode": "slo", "maxReplicas": 3})
    assert "autoscaling" not in capacity_job.capacity_status(record, 0.9)
    for arm in record["arms"]:   # engines whose gauges were never read
        for probes in arm["probes"]:
            for p in probes:
                p["gauges"] = {}
    assert "reason" in capacity_job.capacity_status(
        record, 0.9, autoscaling={"maxReplicas": 3})["autoscaling"]


def test_a_capacity_winner_is_recommended_with_the_autoscalers_target():
    """The Job's apply (tuner.incluster.job.run_capacity): status.capacity of the winner,
    and the autoscaler's target joins the engine settings in the patch."""
    from test_tuner_cluster_apply import Run

    from tuner.incluster.apply import apply_decision

    run = Run("Manual")
    record = _capacity_record()
    apply_decision(run, record, capacity=capacity_job.confirmed_capacity(
        record, 0.9, {"maxReplicas": 3}))
    assert run.status["decision"]["winner"] == "C1"
    assert run.status["recommendation"]["patch"] == {
        "spec": {"engine": {"maxNumSeqs": 8}, "autoscaling": {"target": "1.4"}}}
    assert run.status["capacity"]["ratePerReplica"] == 7.0
    assert run.status["best"]["capacity"] == pytest.approx(22 / 3, rel=1e-3)
    # a winner that measured worse is not applied: the baseline's capacity is reported
    run = Run("Manual")
    run.spec.capacity = object()   # spec.capacity given: the kept settings' capacity too
    record["gains"]["C1"]["ratio"] = 0.9
    apply_decision(run, record, capacity=capacity_job.confirmed_capacity(
        record, 0.9, {"maxReplicas": 3}))
    assert run.status["decision"]["winner"] is None
    assert run.status["capacity"]["ratePerReplica"] == 2.75
    assert run.status["capacity"]["engine"] == {"maxNumSeqs": 1}


def test_no_headroom_reports_the_pilots_capacity_and_applies_nothing():
    """No candidate simulated above the baseline (tuner.search.capacity_sweep.no_headroom):
    no rounds ran; status.capacity is the baseline's pilot, and nothing is applied."""
    from test_tuner_cluster_apply import Run

    from tuner.incluster.apply import apply_decision

    run = Run("Auto")
    run.spec.capacity = object()
    base = {"label": "baseline", "params": {"max_num_seqs": 1}, "sim": 3.0, "capacity": [2.5],
            "failed": [None], "probes": [[_probe(2, True, 0.3), _probe(4, False, 3.0)]],
            "refused": []}
    reason = "no headroom in simulation: the best simulated setting (max_num_seqs=2) ..."
    record = {"arms": [base], "rounds": 0, "gains": {}, "figure": "capacity",
              "decision": {"winner": None, "reason": reason}}
    apply_decision(run, record, capacity=capacity_job.confirmed_capacity(
        record, 0.9, {"maxReplicas": 3}))
    assert run.status["applied"] == "No" and run.status["decision"] == {
        "winner": None, "reason": reason}
    assert run.status["capacity"]["ratePerReplica"] == 2.5
    assert run.status["capacity"]["source"] == "pilot" and run.status["capacity"]["rounds"] == 1
    assert "recommendation" not in run.status
