"""The pilot (the baseline's unscored capacity search that fits the simulator) against
the baseline's own confirmation rounds: a pilot measured while the machine ran at another
speed is flagged (tuner.search.capacity_sweep.pilot_drift)."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

import tuner.search.capacity_sweep as cs
from test_capacity_sweep import FakeSim, _config, _real


@pytest.mark.parametrize("pilot_speed,flagged", [(0.5, True), (1.0, False), (1.15, False),
                                                (1.4, True)])
def test_a_pilot_on_a_machine_at_another_speed_is_flagged_against_the_baselines_rounds(
        tmp_path, monkeypatch, pilot_speed, flagged):
    """The pilot fits the simulator (serving term, pools, anchor); measured while the
    machine ran at half speed (a fresh VM, 2026-12-07) it is flagged with a warning in the
    confirmation; one within the rounds' noise is not."""
    from tuner.search.capacity_report import confirmation_table

    _real(monkeypatch)
    measured = cs.measure_capacity

    def slow_pilot(settings, launch, load, slos, **kwargs):
        result = measured(settings, launch, load, slos, **kwargs)
        if load.seed == 0:   # the pilot's stream
            result = dataclasses.replace(
                result, rate=result.rate * pilot_speed,
                upper=result.upper and result.upper * pilot_speed,
                probes=[{**p, "rate": p["rate"] * pilot_speed} for p in result.probes])
        return result
    monkeypatch.setattr(cs, "measure_capacity", slow_pilot)
    logged: list[str] = []
    plan = cs.CapacityPlan(sim=FakeSim(), sim_base={}, trials=8, real_probes=4,
                           log=logged.append)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=3), plan)
    drift = record["pilot_drift"]
    rounds = record["arms"][0]["capacity"]
    assert drift["baseline_median"] == statistics.median(rounds)
    assert drift["ratio"] == pytest.approx(record["pilot"]["capacity"] / statistics.median(rounds))
    assert drift["ratio"] == pytest.approx(pilot_speed, rel=0.15)
    assert drift["flagged"] is flagged
    table = confirmation_table(record)
    assert f"{drift['ratio']:.2f}x its rounds' median" in table
    assert ("warning: the pilot read" in table) is flagged
    assert any("ran at another speed" in line for line in logged) is flagged


def test_a_pilot_inside_the_baselines_own_spread_is_not_flagged():
    """Rounds that spread as the 2026-12-03 ones did (6.05, 11.60, 14.22): a pilot 0.77x
    their median is inside them, noise of the same kind; below them it is flagged; a
    failed round or pilot is left out."""
    base = {"capacity": [7.0, 13.0, 14.0], "failed": [None] * 3}
    assert cs.pilot_drift({"capacity": 10.0, "failed": None}, base)["flagged"] is False
    low = cs.pilot_drift({"capacity": 6.5, "failed": None}, base)
    assert low["flagged"] is True and low["ratio"] == pytest.approx(0.5)
    base["failed"][1] = "the engine did not start"
    base["capacity"][1] = 0.0
    assert cs.pilot_drift({"capacity": 10.0, "failed": None}, base)["baseline_median"] == 10.5
    assert cs.pilot_drift({"capacity": 0.0, "failed": "x"}, base) is None
