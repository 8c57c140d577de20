"""The SLO planner's arithmetic (tuner/planner/core.py) on synthetic observations."""
import pytest

from tuner.planner.core import (UTILISATION, Observation, Planner, PlannerSpec, Prediction,
                                slowdown)

# a replica planned at 10 req/s: its SLO capacity, less the planner's margin
PRED = Prediction(capacity=10.0 / UTILISATION, itl_p50=0.05)


def _obs(at, rate, replicas, itl=0.05):
    return Observation(at=at, rate=rate, replicas=replicas, itl_p50=itl)


def test_a_step_in_rate_gives_the_predicted_replicas():
    planner = Planner(PlannerSpec(min_replicas=1, max_replicas=10))
    assert planner.decide(_obs(0, 8.0, 1), PRED).replicas == 1
    up = planner.decide(_obs(30, 32.0, 1), PRED)       # a 4x step: up at once
    assert up.replicas == 4 and up.wanted == 4
    exact = Planner(PlannerSpec(max_replicas=10)).decide(_obs(0, 20.0, 1), PRED)
    assert exact.replicas == 2                          # 20 / 10 is 2, not 3
    assert Planner(PlannerSpec(max_replicas=10)).decide(_obs(0, 20.5, 1), PRED).replicas == 3


def test_a_lower_capacity_for_the_mix_raises_the_replicas():
    """A mix shift (longer prompts): the predictor's capacity falls, the replicas rise."""
    short = Planner(PlannerSpec(max_replicas=20)).decide(_obs(0, 30.0, 1), PRED)
    long = Planner(PlannerSpec(max_replicas=20)).decide(
        _obs(0, 30.0, 1), Prediction(capacity=4.0 / UTILISATION, itl_p50=0.05))
    assert (short.replicas, long.replicas) == (3, 8)


def test_the_correction_moves_the_prediction_toward_what_was_observed():
    planner = Planner(PlannerSpec(max_replicas=50))
    first = planner.decide(_obs(0, 20.0, 2, itl=0.10), PRED)  # steps 2x slower than profiled
    assert first.correction == pytest.approx(1.5)            # half way, from 1
    second = planner.decide(_obs(30, 20.0, 2, itl=0.10), PRED)
    assert second.correction == pytest.approx(1.75)
    assert second.corrected_capacity == pytest.approx(10.0 / 1.75)   # 0.9 x 11.1 / 1.75
    assert second.replicas == 4                               # 20 / 5.71, not 20 / 10
    for t in range(60, 600, 30):
        last = planner.decide(_obs(t, 20.0, 4, itl=0.10), PRED)
    assert last.correction == pytest.approx(2.0, rel=1e-3)
    fast = Planner(PlannerSpec(max_replicas=50))
    assert fast.decide(_obs(0, 20.0, 2, itl=0.001), PRED).correction == pytest.approx(
        1 + 0.5 * (0.25 - 1))                                 # clamped at 1/4


def test_stabilisation_holds_a_scale_down_for_its_window():
    planner = Planner(PlannerSpec(max_replicas=10, scale_down_stabilization=120))
    assert planner.decide(_obs(0, 40.0, 1), PRED).replicas == 4
    dip = planner.decide(_obs(30, 10.0, 4), PRED)
    assert dip.wanted == 1 and dip.replicas == 4 and "held at 4" in dip.reason
    assert planner.decide(_obs(90, 10.0, 4), PRED).replicas == 4
    assert planner.decide(_obs(121, 10.0, 4), PRED).replicas == 1   # 4 fell out of 120 s
    assert planner.decide(_obs(150, 35.0, 1), PRED).replicas == 4   # up: at once


def test_idle_goes_to_zero_only_after_the_idle_window_and_comes_back():
    spec = PlannerSpec(min_replicas=0, max_replicas=4, idle_window=300,
                       scale_down_stabilization=0)
    planner = Planner(spec)
    assert planner.decide(_obs(0, 5.0, 1), PRED).replicas == 1
    assert planner.decide(_obs(200, 0.0, 1), PRED).replicas == 1     # idle 200 s
    zero = planner.decide(_obs(300, 0.0, 1), PRED)
    assert zero.replicas == 0 and "no request for 300 s" in zero.reason
    assert planner.decide(_obs(330, 0.2, 0), PRED).replicas == 1     # a request: back
    trickle = Planner(spec).decide(_obs(0, 1e-12, 0), PRED)         # any request: one
    assert trickle.replicas == 1
    kept = Planner(PlannerSpec(min_replicas=1, idle_window=0, scale_down_stabilization=0))
    assert kept.decide(_obs(0, 0.0, 3), PRED).replicas == 1          # minReplicas 1


def test_requests_held_at_zero_wake_the_first_replica_and_restart_the_idle_clock():
    spec = PlannerSpec(min_replicas=0, max_replicas=4, idle_window=300,
                       scale_down_stabilization=0)
    planner = Planner(spec)
    zero = planner.decide(_obs(0, 0.0, 0), PRED)     # a planner started at zero keeps it
    assert zero.replicas == 0 and zero.reason == "no request and no replica: zero stays"
    woke = planner.wake(1000, held=3)
    assert woke.replicas == 1 and woke.reason.startswith("3 request(s) held by the router")
    # the idle window counts from the wake-up, not from the last request Prometheus saw
    assert planner.decide(_obs(1200, 0.0, 1), PRED).replicas == 1
    assert planner.decide(_obs(1300, 0.0, 1), PRED).replicas == 0
    assert Planner(PlannerSpec(min_replicas=0, max_replicas=4)).wake(0, held=1).replicas == 1


def test_bounds_and_bad_specs():
    capped = Planner(PlannerSpec(min_replicas=2, max_replicas=3)).decide(_obs(0, 100.0, 1), PRED)
    assert capped.replicas == 3 and capped.wanted == 10 and "bounded to [2, 3]" in capped.reason
    assert Planner(PlannerSpec(min_replicas=2)).decide(_obs(0, 1.0, 1), PRED).replicas == 2
    nothing = Planner(PlannerSpec()).decide(_obs(0, 5.0, 3), Prediction(capacity=0.0))
    assert nothing.replicas == 3 and nothing.reason.startswith("unchanged")
    with pytest.raises(ValueError, match=r"maxReplicas \(1\) must be >= 1 and >= minReplicas \(2\)"):
        PlannerSpec(min_replicas=2, max_replicas=1)
    with pytest.raises(ValueError, match="forecast 'arima'"):
        PlannerSpec(forecast="arima")
    with pytest.raises(ValueError, match="targetAttainment"):
        PlannerSpec(target_attainment=0)


class Answers:
    """Synthetic Prometheus answers for tuner/planner/observe.py: the window's figures and
    the engines' running and waiting gauges at each instant."""

    url = "http://synthetic"

    def __init__(self, requests: float, gauges: dict) -> None:
        self.requests, self.gauges = requests, gauges

    def figures(self, sel, start, end):
        return {"server_requests": self.requests, "server_itl_p50": 0.05}

    def scalar(self, expr, *, at):
        name = expr.split("(", 1)[1].split("{", 1)[0]
        return self.gauges.get((name, at))


def test_the_arrival_rate_counts_the_backlog_growing_inside_the_engines():
    """An overloaded service finishes only what it can serve: arrivals are the finished
    requests plus the growth of running + waiting over the window."""
    from tuner.planner.observe import observe

    run, wait = "vllm:num_requests_running", "vllm:num_requests_waiting"
    growing = Answers(300, {(run, 70.0): 8, (wait, 70.0): 2, (run, 130.0): 16,
                            (wait, 130.0): 54})
    obs = observe(growing, 'job="x"', window=60.0, at=130.0, replicas=2)
    assert obs.completed == 5.0 and obs.in_system == 70
    assert obs.rate == pytest.approx((300 + 60) / 60)          # 6 req/s arrived
    draining = Answers(300, {(run, 70.0): 16, (wait, 70.0): 44, (run, 130.0): 16})
    assert observe(draining, 'job="x"', window=60.0, at=130.0,
                   replicas=2).rate == pytest.approx((300 - 44) / 60)   # no waiting series
    assert observe(Answers(300, {}), 'job="x"', window=60.0, at=130.0,
                   replicas=2).rate == 5.0                     # no gauges: the completions
    gone = Answers(0, {(run, 70.0): 3, (run, 130.0): 0})
    assert observe(gone, 'job="x"', window=60.0, at=130.0, replicas=2).rate == 0.0


def test_the_correction_is_learned_only_from_a_steady_window():
    """A queue filling (arrivals above completions) stretches the gaps with waiting, not
    with slower steps: the replicas follow the arrivals, the correction stays."""
    planner = Planner(PlannerSpec(max_replicas=50))
    filling = Observation(at=0, rate=30.0, replicas=2, itl_p50=0.20, completed=20.0)
    first = planner.decide(filling, PRED)
    assert first.correction == 1.0 and first.replicas == 3          # 30 / 10
    draining = Observation(at=30, rate=20.0, replicas=3, itl_p50=0.20, completed=23.0)
    assert planner.decide(draining, PRED).correction == 1.0
    edge = Observation(at=60, rate=22.0, replicas=3, itl_p50=0.10, completed=20.0)
    assert planner.decide(edge, PRED).correction == pytest.approx(1.5)   # 10 %: steady
    past = Observation(at=90, rate=22.1, replicas=3, itl_p50=0.10, completed=20.0)
    assert planner.decide(past, PRED).correction == pytest.approx(1.5)   # just past it


def test_a_queue_is_sized_to_clear_within_one_interval():
    """Requests waiting now count as extra rate over the next interval: 30 waiting with a
    30-s interval is 1 req/s more."""
    planner = Planner(PlannerSpec(max_replicas=10, interval=30))
    plain = planner.decide(Observation(at=0, rate=19.5, replicas=2, waiting=0.0), PRED)
    assert plain.replicas == 2
    queued = Planner(PlannerSpec(max_replicas=10, interval=30)).decide(
        Observation(at=0, rate=19.5, replicas=2, waiting=30.0), PRED)
    assert queued.replicas == 3 and "30 waiting" in queued.reason   # 20.5 / 10
    longer = Planner(PlannerSpec(max_replicas=10, interval=60)).decide(
        Observation(at=0, rate=19.5, replicas=2, waiting=30.0), PRED)
    assert longer.replicas == 2                                      # 20.0 / 10


def _profiled_itl(r):
    """A profile's median inter-token latency that rises toward its capacity of 30 req/s."""
    return 0.05 / (1 - r / 30) if r < 29 else None


def test_the_slowdown_is_solved_by_time_scaling_not_read_as_a_ratio():
    """An engine 1.25x slower than its profile at 20 req/s per replica serves like the
    profile at 25 req/s with every time 1.25x longer: its gaps read 0.375 s against the
    profile's 0.15 s at 20 req/s. The plain ratio says 2.5x slower; the solve 1.25x."""
    observed = 1.25 * _profiled_itl(20 * 1.25)
    assert observed / _profiled_itl(20) == pytest.approx(2.5)
    for around in (1.0, 0.3, 4.0, 1.25):         # wherever the smoothed correction stands
        assert slowdown(observed, 20.0, _profiled_itl, around) == pytest.approx(1.25, rel=0.02)
    # a flat profile: the ratio itself, exactly
    assert slowdown(0.10, 20.0, lambda r: 0.05, 1.0) == pytest.approx(2.0)
    assert slowdown(0.01, 5.0, lambda r: 0.05, 3.0) == pytest.approx(0.25)   # at the bounds
    assert slowdown(1.00, 5.0, lambda r: 0.05, 0.5) == pytest.approx(4.0)
    # the planner learns it: replicas for 100 req/s at 0.9 x 24 per replica, not at 0.9 x 12
    planner = Planner(PlannerSpec(max_replicas=50))
    pred = Prediction(capacity=30.0, itl_p50=_profiled_itl(20), itl_at=_profiled_itl)
    for t in range(0, 600, 30):
        last = planner.decide(_obs(t, 100.0, 5, itl=observed), pred)
    assert last.correction == pytest.approx(1.25, rel=0.02)
    assert last.replicas == 5                      # 100 / 21.6; the ratio's 2.5 gave 10


def test_each_replica_is_planned_below_its_slo_capacity():
    """At its SLO capacity a replica meets the SLOs for just the target share: the planner
    keeps UTILISATION of it (0.9): 19 req/s at 10 per replica takes 3, not 2."""
    planner = Planner(PlannerSpec(max_replicas=10))
    assert planner.decide(_obs(0, 19.0, 1), Prediction(capacity=10.0)).replicas == 3
    assert Planner(PlannerSpec(max_replicas=10)).decide(
        _obs(0, 17.9, 1), Prediction(capacity=10.0)).replicas == 2


def test_target_utilization_plans_each_replica_at_that_share_of_its_capacity():
    """spec.autoscaling.targetUtilization: 19 req/s at 10 per replica takes 4 replicas
    planned at 0.5 (5 each), 3 at 0.9, 2 at 1 (the capacity itself, no margin); the
    forecast's arrivals alone (not the queue) are held by the stabilisation at that share
    too."""
    cap = Prediction(capacity=10.0)
    for share, replicas in ((0.5, 4), (0.9, 3), (1.0, 2)):
        spec = PlannerSpec(max_replicas=10, utilisation=share)
        decision = Planner(spec).decide(_obs(0, 19.0, 1), cap)
        assert decision.replicas == replicas
        assert decision.corrected_capacity == pytest.approx(10.0 * share)
    planner = Planner(PlannerSpec(max_replicas=10, utilisation=0.5, interval=15,
                                  scale_down_stabilization=60))
    assert planner.decide(_obs(0, 19.0, 1), cap).replicas == 4
    dip = planner.decide(_obs(15, 4.0, 4), cap)
    assert dip.replicas == 4 and "arrivals wanted 4" in dip.reason
    for share in (0, -0.5, 1.01):
        with pytest.raises(ValueError, match="targetUtilization must be in"):
            PlannerSpec(utilisation=share)


def test_a_queue_being_cleared_is_not_held_by_the_stabilisation():
    """After a step the replicas that cleared the queue go as soon as it is gone; the ones
    the arrivals asked for stay for the stabilisation window."""
    planner = Planner(PlannerSpec(max_replicas=20, interval=15,
                                  scale_down_stabilization=60))
    assert planner.decide(Observation(at=0, rate=10.0, replicas=1), PRED).replicas == 1
    step = planner.decide(Observation(at=15, rate=30.0, replicas=1, waiting=600.0), PRED)
    assert step.replicas == 7                      # (30 + 600 / 15) / 10
    cleared = planner.decide(Observation(at=30, rate=30.0, replicas=7, waiting=0.0), PRED)
    assert cleared.replicas == 3                   # the arrivals' 3, at once
    dip = planner.decide(Observation(at=45, rate=10.0, replicas=3, waiting=0.0), PRED)
    assert dip.replicas == 3 and "arrivals wanted 3" in dip.reason


def test_the_idle_window_is_not_held_again_by_the_stabilisation():
    planner = Planner(PlannerSpec(min_replicas=0, max_replicas=4, interval=30,
                                  idle_window=120, scale_down_stabilization=60))
    replicas = [planner.decide(_obs(0, 25.0, 1), PRED).replicas]
    for t in range(30, 181, 30):
        replicas.append(planner.decide(_obs(t, 0.0, replicas[-1]), PRED).replicas)
    # the arrivals' 3 held for 60 s, then 1 while idle < 120 s, then 0 at 120 s: the idle
    # intervals' one replica is not held for another 60 s
    assert replicas == [3, 3, 3, 1, 0, 0, 0]
