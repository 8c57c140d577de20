"""The planner's forecast of the next interval's rate (tuner/planner/forecast.py): `holt`
(statsmodels' Holt linear trend) meets a ramp with the next interval's rate, forecasts a
flat rate as itself, never goes below zero, and is `none` until it has enough points; the
spec's values, the CRD's enum and the planner's agree."""
from __future__ import annotations

import random

import pytest
import yaml

from paged_api import autoscaling
from tuner.planner.core import UTILISATION, Observation, Planner, PlannerSpec, Prediction
from tuner.planner.forecast import FORECASTS, MIN_POINTS, WINDOW, Forecaster


def feed(method: str, rates: list[float]) -> list[float]:
    f = Forecaster(method)
    return [f.next(r) for r in rates]


def test_a_ramp_is_met_with_the_next_intervals_rate():
    rates = [2.0 * i for i in range(1, 13)]          # +2 req/s every interval
    out = feed("holt", rates)
    assert out[:MIN_POINTS - 1] == rates[:MIN_POINTS - 1]   # too few points: the last rate
    for rate, forecast in zip(rates[MIN_POINTS:], out[MIN_POINTS:]):
        assert forecast == pytest.approx(rate + 2.0, rel=0.05)
    assert feed("none", rates) == rates


def test_holt_looks_as_far_ahead_as_the_replicas_start_up():
    """A horizon of h intervals (1 + start-up / interval) forecasts the ramp h intervals on,
    fractions of an interval too; `none` is the last rate whatever the horizon; a horizon
    under one interval is refused."""
    rates = [2.0 * i for i in range(1, 13)]
    for horizon in (1.0, 2.5, 4.0):
        f = Forecaster("holt", horizon)
        out = [f.next(r) for r in rates]
        for rate, forecast in zip(rates[MIN_POINTS:], out[MIN_POINTS:]):
            assert forecast == pytest.approx(rate + 2.0 * horizon, rel=0.03)
    flat = Forecaster("holt", 3.0)
    assert [flat.next(5.0) for _ in range(8)] == [5.0] * 8
    # a fall is met one interval ahead whatever the horizon: removing replicas is at once
    falls = [40.0 - 2.0 * i for i in range(12)]
    near, far = Forecaster("holt"), Forecaster("holt", 4.0)
    assert [near.next(r) for r in falls] == [far.next(r) for r in falls]
    lagged = Forecaster("none", 3.0)
    assert [lagged.next(r) for r in rates] == rates
    with pytest.raises(ValueError, match="horizon must be >= 1 interval"):
        Forecaster("holt", 0.5)


def test_a_flat_or_noisy_rate_forecasts_its_level_and_a_fall_stops_at_zero():
    assert feed("holt", [5.0] * 10) == [5.0] * 10
    rng = random.Random(3)
    noisy = [4.0 + rng.gauss(0, 0.3) for _ in range(3 * WINDOW)]
    assert all(3.0 < f < 5.0 for f in feed("holt", noisy)[MIN_POINTS:])
    falling = feed("holt", [8.0, 6.0, 4.0, 2.0, 0.0, 0.0])
    assert falling[4] == 0.0 and min(falling) >= 0.0   # the trend says -2: floored


def test_the_planner_scales_for_the_forecast():
    pred = Prediction(capacity=10.0 / UTILISATION, itl_p50=0.05)   # 10 planned per replica
    plans = {m: Planner(PlannerSpec(max_replicas=20, forecast=m)) for m in FORECASTS}
    last = {}
    for i, rate in enumerate([10.0, 20.0, 30.0, 40.0, 50.0, 60.0]):
        obs = Observation(at=30.0 * i, rate=rate, replicas=6, itl_p50=0.05)
        last = {m: p.decide(obs, pred) for m, p in plans.items()}
    assert last["none"].forecast == 60.0 and last["none"].replicas == 6
    assert last["holt"].forecast == pytest.approx(70.0, rel=0.05)
    assert last["holt"].replicas == 7 and "70" in last["holt"].reason


def test_the_planner_forecasts_past_the_replicas_start_up():
    """startupSeconds of one interval: holt's forecast on a ramp is two intervals ahead,
    so the planner asks for the replicas of the rate they will serve; 0 is one interval
    ahead; a negative start-up is refused, naming it."""
    pred = Prediction(capacity=10.0 / UTILISATION, itl_p50=0.05)
    plans = {s: Planner(PlannerSpec(max_replicas=20, forecast="holt", interval=30.0,
                                    startup=s)) for s in (0.0, 30.0)}
    for i, rate in enumerate([10.0, 20.0, 30.0, 40.0, 50.0, 60.0]):
        obs = Observation(at=30.0 * i, rate=rate, replicas=6, itl_p50=0.05)
        last = {s: p.decide(obs, pred) for s, p in plans.items()}
    assert last[0.0].forecast == pytest.approx(70.0, rel=0.05) and last[0.0].replicas == 7
    assert last[30.0].forecast == pytest.approx(80.0, rel=0.05) and last[30.0].replicas == 8
    with pytest.raises(ValueError, match="startupSeconds >= 0"):
        PlannerSpec(startup=-1.0)


def test_one_list_of_methods_in_the_spec_the_crd_and_the_planner():
    from tests.charts.chart_tools import CRD_FILE
    assert autoscaling.FORECASTS == FORECASTS
    crd = yaml.safe_load(CRD_FILE.read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["autoscaling"]["properties"]
    assert props["forecast"]["enum"] == list(FORECASTS)
    with pytest.raises(ValueError, match="forecast 'prophet'"):
        Forecaster("prophet")
