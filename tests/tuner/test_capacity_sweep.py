"""The capacity sweep (tuner/search/capacity_sweep.py): the search runs on the simulator,
only the best K and the baseline start real engines (counted), the decision is the paired
real capacity ratio with its interval; the CLI's rules. The capacity search itself (the
interpolated capacity, the growing bracket): test_capacity_search.py; the pilot against the
baseline's rounds: test_capacity_pilot_drift.py."""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import tuner.search.capacity_sweep as cs
from paged_api.search_space import build_space
from test_capacity_search import _knee
from tuner.measure.capacity import search_capacity
from tuner.search.capacity_report import result_lines
from tuner.sim.profile import Fit, Identity, Memory, Profile
from tuner.search.confirm import Baseline
from tuner.measure.loadgen import LoadSpec


def _profile():
    return Profile(Identity("m", "f", "hw", "t", 1),
                   Fit("tokens", {"intercept": 0.01, "num_tokens": 1e-4}, 0.05),
                   Memory(0, 1e6, 1000, 0, 0, 2048, 100), num_steps=100)


@dataclass
class FakeSim:
    """The simulator's interface: a capacity that is a known function of the settings."""

    attainment: float = 0.9
    sustain: float = 60.0       # s a passing rate's queue must hold (SimContext)
    profile: Profile = field(default_factory=_profile)
    calls: list = field(default_factory=list)
    starts: list = field(default_factory=list)   # each call's first probed rate
    fits: list = field(default_factory=list)     # the profile's fit of each call
    front_seconds: float = 0.0
    warmup_requests: int = 0    # served before each load's window (SimContext)
    duration: float = 10.0      # virtual seconds per load (SimContext)
    refit_scale: float = 1.0    # capacities x this on any profile but the first (a refit)
    calibration: Profile | None = None
    levels: dict = field(default_factory=dict)   # each fit's first intercept (unscaled)

    def __post_init__(self):
        self.calibration = self.calibration or self.profile

    @staticmethod
    def truth(settings: dict) -> float:
        seqs = settings.get("max_num_seqs", 256)
        return 10 * min(seqs, 16) / 16 + (2 if settings.get("block_size") == 32 else 0)

    def capacity(self, settings, *, start, **search):
        self.calls.append(settings)
        self.starts.append(start)
        self.fits.append(self.profile.fit)
        fit, calibration = self.profile.fit, self.calibration.fit
        family = (fit.form, fit.heldout_error)   # kept when step times are scaled
        scale = 1.0 if family == (calibration.form, calibration.heldout_error) \
            else self.refit_scale
        # step times x f (capacity_profile.anchor_time) serve 1/f of the requests
        first = self.levels.setdefault(family, fit.coefficients.get("intercept"))
        if first:
            scale *= first / fit.coefficients["intercept"]
        return search_capacity(_knee(self.truth(settings) * scale), {"chat": {"ttft": 1.0}},
                               start=start, **search)


def _config(tmp_path, *, remeasure=2, rounds=3):
    space = build_space(params=["max_num_seqs=1..64:log", "block_size=16,32",
                                "gpu_memory_utilization=0.9", "max_num_batched_tokens=none",
                                "num_speculative_tokens=none", "kv_offloading_size=0,1"])
    return SimpleNamespace(space=space, fixed={}, seed=0, remeasure=remeasure,
                           confirm_rounds=rounds, min_gain=1.0, out_dir=tmp_path,
                           load=LoadSpec(workload="chat", duration=10.0, users=2),
                           slos={"chat": {"ttft": 1.0}}, launch=None, warmup_requests=2,
                           baseline=Baseline({"max_num_seqs": 8}, {"max_num_seqs": 8},
                                             "a test baseline"))


def _real(monkeypatch, *, factor=0.5, noise=0.02):
    """measure_capacity replaced by a real-looking system: the simulated truth times
    `factor`, with multiplicative noise per engine; every call counted."""
    rng, calls = random.Random(1), []

    def measure_capacity(settings, launch, load, slos, *, start, growth, max_probes,
                         max_growth=None, **kwargs):
        calls.append({"settings": settings, "start": start, "growth": growth,
                      "max_growth": max_growth, "seed": load.seed,
                      "max_probes": max_probes, "warmup_load": kwargs.get("warmup_load"),
                      "sustain": kwargs.get("sustain")})
        real = FakeSim.truth(settings) * factor * math.exp(rng.gauss(0, noise))
        return search_capacity(_knee(real), slos, start=start, growth=growth,
                               max_growth=max_growth, max_probes=max_probes,
                               rel_tol=kwargs["rel_tol"])
    monkeypatch.setattr(cs, "measure_capacity", measure_capacity)
    return calls


def test_only_the_best_k_and_the_baseline_run_for_real_and_the_better_one_wins(
        tmp_path, monkeypatch):
    calls = _real(monkeypatch)
    sim = FakeSim(warmup_requests=150, sustain=30.0)
    plan = cs.CapacityPlan(sim=sim, sim_base={"cpu_memory_gib": 0.5}, trials=16,
                           real_probes=4, log=lambda s: None)
    record = cs.run_capacity_sweep(_config(tmp_path), plan)
    # every real engine warmed as the simulated ones are, before its first probe, and
    # judged by the queue the simulated ones must hold
    assert {c["warmup_load"] for c in calls} == {150}
    assert {c["sustain"] for c in calls} == {30.0} and record["sustain_s"] == 30.0
    assert len(sim.calls) >= 2 and all(c["cpu_memory_gib"] == 0.5 for c in sim.calls)
    # the host tier is simulated (tuner/sim/tiers.py): its size searched like the rest
    assert {p["params"].get("kv_offloading_size") for p in record["simulated"]} == {0, 1}
    labels = [a["label"] for a in record["arms"]]
    assert labels == ["baseline", "C1", "C2"]
    # FakeSim's truth ignores the host tier: every candidate keeps the smallest, 0 GiB
    assert [a["params"]["kv_offloading_size"] for a in record["arms"][1:]] == [0, 0]
    # a pilot of the baseline, then (K + 1) arms x R rounds real engines, nothing else
    assert len(calls) == 1 + 3 * 3 == record["real_engines"]
    pilot, calls = calls[0], calls[1:]
    assert pilot["settings"] == {"max_num_seqs": 8} and pilot["seed"] == 0
    assert (pilot["growth"], pilot["max_growth"], pilot["max_probes"]) == (
        2.0, None, plan.real_probes + 3)
    assert record["pilot"]["capacity"] > 0
    assert record["pilot"]["capacity"] not in record["arms"][0]["capacity"]   # not scored
    assert {c["seed"] for c in calls} == {1, 2, 3}          # one stream per round
    best = record["arms"][1]
    assert best["sim"] == max(p["capacity"] for p in record["simulated"] if p["capacity"])
    winner = {a["label"]: a for a in record["arms"]}[record["winner"]]
    assert winner["gain"]["low"] > 1 and winner["gain"]["ratio"] == pytest.approx(
        FakeSim.truth(winner["settings"]) / FakeSim.truth({"max_num_seqs": 8}), rel=0.1)
    # each arm's search starts at sim x its own real/simulated ratio (the baseline's
    # first: the pilot's) in small steps that grow; a candidate's first starts from the
    # others' ratio with more probes
    base, c1 = record["arms"][0], record["arms"][1]
    of = {label: [c for c in calls if c["settings"] == arm["settings"]]
          for label, arm in (("baseline", base), ("C1", c1), ("C2", record["arms"][2]))}
    assert all(len(v) == 3 for v in of.values())
    steps = (cs.REAL_GROWTH, cs.REAL_MAX_GROWTH)
    assert {(c["growth"], c["max_growth"], c["max_probes"]) for c in of["baseline"]} == {
        (*steps, plan.real_probes)}
    for label in ("C1", "C2"):
        first, *later = of[label]
        assert (first["growth"], first["max_growth"], first["max_probes"]) == (
            *steps, plan.real_probes + 3)
        assert {(c["growth"], c["max_growth"], c["max_probes"]) for c in later} == {
            (*steps, plan.real_probes)}
    # started at its own last crossing, an arm whose capacity moved 2 % brackets in two
    # probes (1.25x steps and a bisection to 10 % took four)
    assert [len(a["probes"][r]) for a in record["arms"] for r in (1, 2)] == [2] * 6
    assert of["baseline"][0]["start"] == pytest.approx(record["pilot"]["capacity"])
    assert of["C1"][0]["start"] == pytest.approx(c1["sim"] * statistics.median(
        [record["pilot"]["capacity"] / base["sim"], base["capacity"][0] / base["sim"]]))
    assert of["C1"][1]["start"] == pytest.approx(c1["capacity"][0])   # its own ratio


def test_every_simulation_of_the_baseline_after_its_pilot_starts_at_the_pilots_rate(
        tmp_path, monkeypatch):
    """Near its knee a short window's attainment is not monotone in the rate, so a simulated
    capacity depends on where its search starts (agentic, 2026-12-05: the defaults at 1.47
    req/s from their pilot's 1.54, at 1.22 from 1 req/s). The profile's check, the anchor and
    the search all read the baseline from the pilot's rate: the figure the candidates are
    ranked against is the one compared with the real pilot."""
    _real(monkeypatch, factor=1.0)
    sim = FakeSim()
    plan = cs.CapacityPlan(sim=sim, sim_base={}, trials=6, real_probes=4, log=lambda s: None)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    baseline = {"max_num_seqs": 8}
    starts = [st for c, st in zip(sim.calls, sim.starts) if c == baseline]
    first, later = starts[0], starts[1:]
    assert first == 1.0                      # before the pilot: from 1 req/s
    assert len(later) >= 2                   # the anchor's and the search's, at least
    assert later == [pytest.approx(record["pilot"]["capacity"])] * len(later)
    assert record["sim_baseline"] == pytest.approx(plan.anchor["simulated"])


def test_a_failed_pilot_leaves_the_first_round_to_bracket_widely(tmp_path, monkeypatch):
    from tuner.measure.runner import Infeasible

    calls = _real(monkeypatch)
    measured = cs.measure_capacity

    def failing_pilot(settings, launch, load, slos, **kwargs):
        if load.seed == 0:
            calls.append({"pilot": True})
            raise Infeasible("the engine did not start")
        return measured(settings, launch, load, slos, **kwargs)
    monkeypatch.setattr(cs, "measure_capacity", failing_pilot)
    plan = cs.CapacityPlan(sim=FakeSim(), sim_base={}, trials=8, real_probes=4,
                           log=lambda s: None)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    assert record["pilot"]["failed"] == "the engine did not start"
    # nothing measured yet: the first round's arms have the wider probe budget
    assert calls[1]["max_probes"] == calls[2]["max_probes"] == plan.real_probes + 3
    assert calls[3]["max_probes"] == calls[4]["max_probes"] == plan.real_probes  # own ratios
    assert all(record["arms"][0]["capacity"])   # the rounds still measured


def test_a_candidate_that_cannot_start_is_replaced_by_the_next_simulated_one(
        tmp_path, monkeypatch):
    """The simulator let through settings whose real engine refuses its pool (SmolLM2's
    agentic sweep: 8-token blocks at 0.65 of the memory, "the KV pool has 829 blocks ...
    one max_model_len sequence needs 1024"): in the first round the next simulated
    setting replaces such a candidate, so the rounds still compare two engines."""
    from tuner.measure.runner import Infeasible

    calls = _real(monkeypatch)
    measured = cs.measure_capacity

    def refuse_the_top(settings, launch, load, slos, **kwargs):
        if settings.get("block_size") == 32 and settings.get("max_num_seqs", 0) >= 16:
            calls.append({"refused": settings})
            raise Infeasible("the KV pool is too small")
        return measured(settings, launch, load, slos, **kwargs)
    monkeypatch.setattr(cs, "measure_capacity", refuse_the_top)
    logs = []
    plan = cs.CapacityPlan(sim=FakeSim(), sim_base={}, trials=16, real_probes=4,
                           log=logs.append)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=3), plan)
    c1 = record["arms"][1]
    refused = [c["refused"] for c in calls if "refused" in c]
    assert refused and [r["params"] for r in c1["refused"]] == refused
    assert len({repr(r) for r in refused}) == len(refused)   # each tried once
    assert not (c1["params"].get("block_size") == 32 and c1["params"]["max_num_seqs"] >= 16)
    assert c1["failed"] == [None] * 3 and all(c > 0 for c in c1["capacity"])
    ranked = cs.candidates(
        [cs.SimPoint(p["params"], p["capacity"]) for p in record["simulated"]], 99,
        {"max_num_seqs": 8})
    assert c1["params"] == ranked[len(refused)].params   # the next one, in simulated order
    assert c1["sim"] == ranked[len(refused)].capacity
    assert record["winner"] == "C1" and any("replaces it" in line for line in logs)


def test_no_gain_keeps_the_baseline_and_the_result_says_so(tmp_path, monkeypatch):
    calls = _real(monkeypatch, noise=0.3)
    config = _config(tmp_path, remeasure=1, rounds=2)
    config.baseline = Baseline({"max_num_seqs": 64, "block_size": 16},   # 32 simulates 1.2x
                               {"max_num_seqs": 64, "block_size": 16}, "16-token blocks")
    record = cs.run_capacity_sweep(config, cs.CapacityPlan(
        sim=FakeSim(), sim_base={}, trials=8, target_rate=50, log=lambda s: None))
    assert record["arms"][1]["sim"] > record["sim_baseline"]   # headroom: confirmed
    assert record["winner"] is None and len(calls) == 1 + 2 * 2
    lines = result_lines(record)
    assert lines[1].startswith("keep the baseline: no significant gain")
    base = sorted(record["arms"][0]["capacity"])
    assert f"replicas for 50 req/s: {math.ceil(50 / ((base[0] + base[1]) / 2))}" in lines[2]


def test_no_headroom_in_simulation_measures_the_pilot_alone(tmp_path, monkeypatch):
    """A baseline the simulator rates above the whole space (16 sequences; the space
    holds at most 8): no candidate is worth a round; the baseline's real capacity is its
    pilot's."""
    calls = _real(monkeypatch)
    config = _config(tmp_path, remeasure=1, rounds=3)
    config.space = build_space(params=["max_num_seqs=1..8:log", "block_size=16",
                                       "gpu_memory_utilization=0.9",
                                       "max_num_batched_tokens=none",
                                       "num_speculative_tokens=none"])
    # its disk KV tier is measured for real and simulated (tuner/sim/tiers.py VirtualDisk)
    disk = {"max_num_seqs": 16, "kv_disk_dir": "/var/kv", "kv_disk_size": 4.0}
    config.baseline = Baseline(disk, disk, "above the space")
    logs: list[str] = []
    sim = FakeSim()
    record = cs.run_capacity_sweep(config, cs.CapacityPlan(
        sim=sim, sim_base={}, trials=8, target_rate=50, log=logs.append))
    assert len(calls) == 1 == record["real_engines"]   # the pilot, no rounds
    assert calls[0]["settings"] == disk
    assert sim.calls[0] == disk   # its simulated twin keeps the disk tier
    assert record["rounds"] == 0 and record["winner"] is None
    assert [a["label"] for a in record["arms"]] == ["baseline"]
    pilot = record["pilot"]["capacity"]
    assert pilot > 0 and record["arms"][0]["capacity"] == [pilot]
    others = [p["capacity"] for p in record["simulated"] if p["capacity"]
              and p["params"] != {"max_num_seqs": 16}]
    assert others and max(others) <= record["sim_baseline"]
    assert record["reason"].startswith("no headroom in simulation: the best simulated "
                                       "setting (") and f"{max(others):.3g} req/s" in record["reason"]
    assert any(line.startswith("no confirmation: no headroom") for line in logs)
    lines = result_lines(record)
    assert lines[0].startswith(f"baseline: {pilot:.2f} req/s per replica (real, the pilot")
    assert lines[1] == f"keep the baseline: {record['reason']}"
    assert f"replicas for 50 req/s: {math.ceil(50 / pilot)} with the baseline" in lines[2]


def test_no_headroom_below_three_percent_and_needs_the_baseline_figure():
    arms = [{"params": {"max_num_seqs": 4}, "sim": 5.0}, {"params": {"max_num_seqs": 2}, "sim": 6.0}]
    assert cs.no_headroom(6.0, arms).endswith("serves 6 req/s against the baseline's 6")
    assert "max_num_seqs=2" in cs.no_headroom(6.0, arms)
    assert cs.no_headroom(6.0 / 1.029, arms) is not None   # under 3 %: within the resolution
    assert cs.no_headroom(6.0 / 1.031, arms) is None       # more: confirm
    assert cs.no_headroom(None, arms) is None and cs.no_headroom(6.0, []) is None


def test_candidates_are_distinct_best_first_and_never_the_baseline():
    pts = [cs.SimPoint({"max_num_seqs": s}, c) for s, c in
           [(8, 9.0), (16, 12.0), (16, 12.0), (32, 11.0), (4, None), (2, 3.0)]]
    chosen = cs.candidates(pts, 3, {"max_num_seqs": 16})
    assert [p.params["max_num_seqs"] for p in chosen] == [32, 8, 2]
    assert [p.params["max_num_seqs"] for p in cs.candidates(pts, 1, {})] == [16]


def test_replicas_round_up():
    assert cs.replicas(100, 25.0) == 4 and cs.replicas(100, 24.9) == 5
    assert cs.replicas(None, 5) is None and cs.replicas(10, 0.0) is None


def _steps_law(series, windows=30, slower=1.0):
    """What read_steps would collect from an engine whose steps follow a known law (each
    step `slower` times longer)."""
    import random

    from prometheus_client import generate_latest

    from engine.entrypoints.metrics import ServerMetrics
    from engine.step_shape import StepShape
    from tuner.sim.live_profile import parse_totals

    metrics, rng = ServerMetrics(model_name="m", max_model_len=2048), random.Random(0)
    for w in range(windows + 1):
        rows = 1 + w % 24
        for _ in range(20):
            shape = StepShape(prefill_tokens=rng.choice([0, 0, 100 * (w % 3)]),
                              decode_seqs=rng.randint(max(1, rows - 3), rows))
            metrics.observe_step(shape, slower * (0.002 + 2e-5 * shape.prefill_tokens
                                                  + 7e-4 * shape.decode_seqs))
        series.append(parse_totals(generate_latest(metrics.registry).decode(), t=w))


def test_a_host_tier_is_trimmed_to_the_smallest_size_that_simulates_as_well(tmp_path):
    """A candidate's host tier is cut to the smallest size of the space within HEADROOM of
    its own simulated capacity (a tier costs host memory; on a pool that never fills
    every size simulates alike); a setting that becomes the baseline's or a chosen one's
    is skipped."""
    class TierSim(FakeSim):
        @staticmethod
        def truth(settings):   # a tier of 1 GiB or more serves 1.5x; none does not
            return FakeSim.truth(settings) * (1.5 if settings.get("kv_offloading_size", 0) >= 1
                                              else 1.0)
    config = _config(tmp_path, remeasure=2)
    config.space = build_space(params=["max_num_seqs=1..64:log", "kv_offloading_size=0,1,2,4"])
    logs: list[str] = []
    plan = cs.CapacityPlan(sim=TierSim(), sim_base={}, trials=4, log=logs.append)
    ranked = [cs.SimPoint(p, TierSim.truth(p)) for p in (
        {"max_num_seqs": 16, "kv_offloading_size": 4}, {"max_num_seqs": 16, "kv_offloading_size": 1},
        {"max_num_seqs": 8, "kv_offloading_size": 4}, {"max_num_seqs": 4, "kv_offloading_size": 0},
        {"max_num_seqs": 2, "kv_offloading_size": 0})]
    # (16, 4) becomes (16, 1), the baseline's; (16, 1) stays itself, the baseline's too
    chosen, rest = cs.smallest_tiers(plan, ranked, config,
                                     {"max_num_seqs": 16, "kv_offloading_size": 1})
    assert [p.params for p in chosen] == [{"max_num_seqs": 8, "kv_offloading_size": 1},
                                          {"max_num_seqs": 4, "kv_offloading_size": 0}]
    assert rest == ranked[4:]
    assert chosen[0].capacity == pytest.approx(TierSim.truth(chosen[0].params), rel=0.1)
    assert sum("1 GiB kept" in line for line in logs) == 2
