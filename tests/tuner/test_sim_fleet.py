"""The fleet simulator behind the planner's benchmark (tuner/sim/fleet.py) and the scalers
it replays (benchmarks/planner_arms.py): the scripted rate and its arrivals, a replica
serving only after its start-up, the router's hold and its bounds, a scale-down that
drains, the oracle's look-ahead, the violation count, the HPA's rules and the planner's
wake-up at zero."""
from __future__ import annotations

import math

import pytest

from benchmarks.planner_arms import HpaArm, OracleArm, PlannerArm
from tuner.planner.core import UTILISATION, Observation, PlannerSpec, Prediction
from tuner.sim import fleet as fleet_mod
from tuner.sim.fleet import Fleet, Script, oracle_replicas, violation_seconds
from tuner.sim.profile import Fit, Identity, Memory, Profile
from tuner.sim.stream import SimRequest

STEP = 0.05   # every engine step takes 50 ms


def _profile() -> Profile:
    return Profile(Identity("builtin://default", "f" * 64, "cpu", "2.13.0", 1),
                   Fit("tokens", {"intercept": STEP, "num_tokens": 0.0}, 0.0),
                   Memory(0.0, 1.3e7, 4096, 0.0, 2e4, 2048, 609), 100)


@pytest.fixture(scope="module")
def hf_config():
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    return AutoConfig.from_pretrained(resolve_model_path(None))


class Stream:
    """Requests of 20 prompt tokens and 10 output tokens."""

    def __init__(self) -> None:
        self.count, self.done = 0, []

    def pop(self) -> SimRequest:
        self.count += 1
        return SimRequest(0.0, "chat", [5 + self.count % 7] * 20, 10, number=self.count)

    def finished(self, request, output_tokens: int) -> None:
        self.done.append(output_tokens)


SETTINGS = dict(block_size=16, max_num_seqs=4, max_num_batched_tokens=256,
                max_model_len=256, num_gpu_blocks_override=64, cpu_threads=1)


class Fixed:
    """A scaler answering `plan(at)` every second."""
    period = 1.0

    def __init__(self, plan) -> None:
        self.plan = plan

    def __call__(self, fleet, at: float) -> int:
        return self.plan(at)


def _fleet(hf_config, script, **kw) -> Fleet:
    return Fleet(_profile(), SETTINGS, Stream(), script, hf_config=hf_config, **kw)


def test_script_rate_is_piecewise_linear_with_steps():
    s = Script([(0, 1.0), (10, 1.0), (10, 4.0), (20, 8.0), (30, 0.0)])
    assert s.rate(5) == 1.0 and s.rate(9.99) == 1.0
    assert s.rate(10) == 4.0 and s.rate(15) == pytest.approx(6.0)
    assert s.rate(25) == pytest.approx(4.0)
    assert s.rate(30) == 0.0 and s.rate(-1) == 0.0
    assert s.peak == 8.0 and s.end == 30
    for bad in ([(0, 1.0)], [(5, 1.0), (2, 1.0)], [(0, 1.0), (1, -1.0)]):
        with pytest.raises(ValueError):
            Script(bad)


def test_arrivals_follow_the_rate_and_skip_the_idle_gap():
    s = Script([(0, 20.0), (50, 20.0), (50, 0.0), (100, 0.0), (100, 5.0), (200, 5.0)])
    times = s.arrivals(seed=3)
    assert times == s.arrivals(seed=3) and times != s.arrivals(seed=4)
    busy = sum(t < 50 for t in times)
    assert not any(50 <= t < 100 for t in times)
    late = sum(t >= 100 for t in times)
    # Poisson counts: 1000 and 500 expected, within 4 standard deviations
    assert abs(busy - 1000) < 4 * math.sqrt(1000) and abs(late - 500) < 4 * math.sqrt(500)


def test_a_replica_serves_after_its_startup_and_held_requests_then_go(hf_config):
    script = Script([(0, 2.0), (20, 2.0)])
    fleet = _fleet(hf_config, script, startup=3.0, initial=0).run(
        Fixed(lambda at: 1 if at >= 5 else 0))
    assert fleet.records and all(r["ok"] for r in fleet.records)
    early = [r for r in fleet.records if r["start"] < 8.0]
    assert early   # arrived before the replica served (added at 5, serving at 8)
    for r in early:
        assert r["ttft"] >= 8.0 - r["start"] - 1e-9
    assert all(r["ttft"] < 1.0 for r in fleet.records if r["start"] > 9.0)
    # held requests are at the router, not in an engine; sent at 8, they are
    assert fleet.in_system(7.9) == 0 and fleet.in_system(8.0) >= len(early)
    assert fleet.replica_seconds() == pytest.approx(15.0)   # from 5 to the script's end


def test_the_hold_is_bounded_in_count_and_time(hf_config):
    assert fleet_mod.HOLD_LIMIT == 64   # the router's --cold-start-queue default
    script = Script([(0, 4.0), (10, 4.0)])
    fleet = _fleet(hf_config, script, startup=1.0, initial=0, hold=2.0,
                   hold_limit=3).run(Fixed(lambda at: 0))
    errors = [r.get("error", "") for r in fleet.records]
    assert all(not r["ok"] for r in fleet.records)
    assert any("full" in e for e in errors) and any("past the router" in e for e in errors)
    assert fleet.replica_seconds() == 0


def test_scale_down_drains_in_flight_requests_and_sends_nothing_new(hf_config):
    script = Script([(0, 12.0), (20, 12.0)])
    fleet = _fleet(hf_config, script, startup=1.0, initial=2).run(
        Fixed(lambda at: 2 if at < 10 else 1))
    assert all(r["ok"] for r in fleet.records)
    leaving = [i for i, r in enumerate(fleet.replicas) if r.gone_at is not None
               and r.gone_at < script.end]
    assert len(leaving) == 1
    gone = fleet.replicas[leaving[0]]
    mine = [r for r in fleet.records if r["replica"] == leaving[0]]
    assert mine and max(r["start"] for r in mine) <= 10.0   # nothing sent after it left
    assert max(r["done"] for r in mine) <= gone.gone_at   # gone only once drained
    assert any(r["done"] > 10.0 for r in mine)   # it had requests in flight at 10
    # the other replica took the rest
    assert all(r["replica"] != leaving[0] for r in fleet.records if r["start"] > 10.0)


def test_oracle_looks_ahead_by_the_startup():
    s = Script([(0, 1.0), (10, 1.0), (10, 5.0), (20, 5.0), (20, 0.0), (30, 0.0)])
    assert oracle_replicas(s, 2.0, 0.0, 3.0) == 1
    assert oracle_replicas(s, 2.0, 6.0, 3.0) == 1
    assert oracle_replicas(s, 2.0, 7.0, 3.0) == 3     # ceil(5 / 2), needed at 10
    assert oracle_replicas(s, 2.5, 12.0, 3.0) == 2    # a whole multiple needs no extra
    assert oracle_replicas(s, 2.0, 25.0, 3.0) == 0
    burst = Script([(0, 1.0), (12, 1.0), (12, 9.0), (13, 9.0), (13, 1.0), (30, 1.0)])
    assert oracle_replicas(burst, 2.0, 10.0, 4.0) == 5   # a burst inside the look-ahead
    arm = OracleArm(s, 1.0, 3.0, max_replicas=4)
    assert arm(None, 12.0) == 4                       # bounded
    assert arm(None, 7.0) == 4 and arm.name == "oracle"   # the step at 10, started ahead
    reactive = OracleArm(s, 1.0, 3.0, max_replicas=8, foresight=False)
    assert reactive.name == "oracle-reactive"
    assert reactive(None, 7.0) == 1 and reactive(None, 9.9) == 1   # sees only the rate now
    assert reactive(None, 10.5) == 5 and reactive(None, 20.5) == 0


def test_violation_seconds_count_windows_below_the_target():
    slos = {"chat": {"ttft": 1.0}}

    def rec(start, ttft, ok=True):
        return {"kind": "chat", "start": start, "ok": ok, "ttft": ttft, "e2e": ttft, "itl": []}
    records = ([rec(1 + i * 0.5, 0.2) for i in range(10)]            # window 0: all met
               + [rec(11 + i * 0.5, 0.2) for i in range(8)]          # window 1: 8 of 10
               + [rec(16, 3.0), rec(17, 0.2, ok=False)]
               + [rec(21 + i * 0.5, 0.2) for i in range(9)] + [rec(26, 2.0)])  # 9 of 10
    assert violation_seconds(records, slos, target=0.9, end=30) == 10.0
    assert violation_seconds(records, slos, target=0.95, end=30) == 20.0
    assert violation_seconds(records, slos, target=0.9, end=10) == 0.0


class View:
    def __init__(self, desired, depths, held=0):
        self.desired, self._depths, self.held = desired, depths, [None] * held

    def queue_depths(self):
        return self._depths

    def finished_between(self, t0, t1):
        return []

    def in_system(self, at):
        return 0


def test_hpa_follows_the_queue_depth_with_kubernetes_rules():
    hpa = HpaArm(2.0, max_replicas=20, stabilization=60)
    assert hpa(View(2, [2.1, 2.1]), 15) == 2            # within the 10 % tolerance
    assert hpa(View(2, [6.0, 6.0]), 30) == 6            # ceil(2 x 3): +4 allowed
    assert hpa(View(6, [10.0] * 6), 45) == 12           # 30 wanted, +100 % per period
    assert hpa(View(12, [0.0] * 12), 60) == 12          # down held by the window's 30
    later = HpaArm(2.0, max_replicas=20, stabilization=60)
    assert later(View(3, [0.0, 0.0, 0.0]), 15) == 1     # nothing earlier: down at once
    assert later(View(1, [0.0]), 30) == 1               # never below one
    assert HpaArm(0.0, max_replicas=4, stabilization=0).target == 0.1
    assert later(View(2, []), 45) == 2                  # no ready pod: no metric


def test_planner_arm_wakes_only_on_held_requests_and_feeds_the_planner():
    spec = PlannerSpec(min_replicas=0, max_replicas=8, interval=15, idle_window=60,
                       scale_down_stabilization=0)
    seen = []
    recs = [{"itl": [0.05, 0.05]} for _ in range(150)]   # 5 req/s over the 30-s window

    class Busy(View):
        def finished_between(self, t0, t1):
            assert t1 - t0 == 30
            return recs

    def predict(per_replica):
        seen.append(per_replica)
        return Prediction(capacity=2.0 / UTILISATION, itl_p50=0.05)   # 2 planned
    arm = PlannerArm(spec, predict)
    assert arm.period == 1.0            # looks at the router every second while at zero
    assert arm(View(0, []), 15) == 0
    assert arm(View(0, [], held=3), 30) == 1
    assert arm(Busy(1, [0]), 31) == 1 and not seen   # between ticks: unchanged
    assert arm(Busy(1, [0]), 45) == 3                    # ceil(5 / 2)
    assert seen == [5.0]

    class Backlogged(Busy):   # 60 more requests inside the engines than 30 s before
        def in_system(self, at):
            return {75: 70, 45: 10}[at]

        def finished_between(self, t0, t1):   # gaps 4x the predicted: waiting in a queue
            return [{"itl": [0.2, 0.2]} for _ in range(150)]
    assert arm(Backlogged(3, [0]), 75) == 4              # (150 + 60) / 30 = 7 req/s arrived
    assert seen[-1] == pytest.approx(7 / 3)
    last = arm.decisions[-1]
    assert last.rate == pytest.approx(7.0) and last.correction == 1.0   # a queue filling


def test_the_benchmarks_summary_splits_failures_by_cause_and_attainment_by_phase(hf_config):
    """bench_planner's summary: each failure under its router error (the cold start's full
    hold apart from its time-outs), and attainment per phase of the script by arrival."""
    from benchmarks.bench_planner import phases, summarize

    script = Script([(0, 4.0), (10, 4.0)])
    fleet = _fleet(hf_config, script, startup=1.0, initial=0, hold=2.0,
                   hold_limit=3).run(Fixed(lambda at: 0))
    row = summarize("none", fleet, {}, 0.9, idle_end=600.0)   # idle 0: the last phase at 600
    full = sum("full" in str(r.get("error")) for r in fleet.records)
    assert 0 < full < len(fleet.records)
    assert row["failed"] == len(fleet.records) == sum(row["failed_by"].values())
    assert row["failed_by"]["the router's hold is full (503)"] == full
    assert row["by_phase"]["0.6 C"] == 0.0 and row["by_phase"]["step to 2.4 C"] is None
    assert [p for p, _, _ in phases(0)][-1] == "0.6 C from zero"
    # requests served within their SLOs count per phase by arrival
    served = _fleet(hf_config, Script([(0, 2.0), (100, 2.0)]), startup=0.0,
                    initial=1).run(Fixed(lambda at: 1))
    row = summarize("one", served, {"chat": {"e2e": 30.0}}, 0.9, idle_end=10_000.0)
    early = [r for r in served.records if r["start"] < 90]
    late = [r for r in served.records if r["start"] >= 90]
    assert early and late and row["failed"] == 0
    assert row["by_phase"]["0.6 C"] == 1.0 and row["by_phase"]["step to 2.4 C"] == 1.0


def test_the_benchmarks_arms_take_a_utilisation():
    """bench_planner's `--arms`: `planner...@U` plans each replica at U of its capacity
    (targetUtilization), `oracle@U` sizes the fleet at U of the true capacity; the HPA
    and unknown arms are refused by name."""
    from benchmarks.bench_planner import make_arm

    s = Script([(0, 5.0), (30, 5.0)])
    spec = PlannerSpec(max_replicas=8, interval=15)
    makers = {"oracle": lambda: OracleArm(s, 2.0, 3.0, max_replicas=8),
              "planner": lambda: PlannerArm(spec, lambda _: Prediction(capacity=2.0)),
              "hpa": lambda: HpaArm(1.0, max_replicas=8, stabilization=0)}
    assert make_arm("oracle", makers)(None, 0.0) == 3            # ceil(5 / 2)
    assert make_arm("oracle@0.5", makers)(None, 0.0) == 5        # ceil(5 / 1)
    plain, half = make_arm("planner", makers), make_arm("planner@0.5", makers)
    assert plain.planner.spec.utilisation == UTILISATION
    assert half.planner.spec.utilisation == 0.5
    obs = Observation(at=15, rate=5.0, replicas=1)
    assert half.planner.decide(obs, Prediction(capacity=2.0)).replicas == 5
    assert plain.planner.decide(obs, Prediction(capacity=2.0)).replicas == 3
    for bad in ("hpa@0.5", "orcale"):
        with pytest.raises(SystemExit, match="unknown arm"):
            make_arm(bad, makers)


def test_the_plots_attainment_breaks_over_windows_without_arrivals():
    """bench_planner's attainment line: one point per 10-s window by arrival, NaN where
    nothing arrived (the idle phase), so the line is not drawn across it."""
    import math

    from benchmarks.bench_planner import attainment_windows

    slos = {"chat": {"e2e": 1.0}}
    records = [{"kind": "chat", "start": s, "ok": True, "e2e": e, "ttft": 0.1, "itl": [],
                "output_tokens": 1}
               for s, e in [(1.0, 0.5), (4.0, 2.0), (12.0, 0.5), (35.0, 0.5), (38.0, 3.0)]]
    xs, ys = attainment_windows(records, slos)
    assert xs == [5.0, 15.0, 25.0, 35.0]
    assert ys[:2] == [0.5, 1.0] and math.isnan(ys[2]) and ys[3] == 0.5
    assert attainment_windows([], slos) == ([], [])
