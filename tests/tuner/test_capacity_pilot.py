"""The capacity sweep's pilot (tuner/search/capacity_sweep.py): the baseline once for real,
its served steps refitting the simulator's profile, its light load timing the front end.
The sweep's search and confirmation: test_capacity_sweep.py; which profile is kept and its
step times' anchor: test_capacity_profile.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import tuner.search.capacity_sweep as cs
from test_capacity_sweep import FakeSim, _config, _real, _steps_law


def test_without_a_serving_term_the_search_runs_on_the_pilots_refit(tmp_path, monkeypatch):
    from test_capacity_profile import no_serving_term

    calls = _real(monkeypatch)
    no_serving_term(monkeypatch)
    watched = []

    def read_steps(url, series, interval):
        watched.append((url, interval))
        _steps_law(series)
        return lambda: None
    monkeypatch.setattr(cs, "read_steps", read_steps)
    calibrated, logs = FakeSim(refit_scale=0.5), []   # the refit predicts the real 0.5 x
    plan = cs.CapacityPlan(sim=calibrated, sim_base={}, trials=6, real_probes=4,
                           log=logs.append)
    real_launch = []

    def measured(settings, launch, load, slos, *, watch=None, **kwargs):
        if watch is not None:
            real_launch.append(load.seed)
            watch("http://engine:8000")()
        return measure(settings, launch, load, slos, **kwargs)
    measure = cs.measure_capacity
    monkeypatch.setattr(cs, "measure_capacity", measured)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    # every engine watched: the pilot (seed 0), then both arms in each round
    assert real_launch == [0, 1, 1, 2, 2] and watched == [("http://engine:8000", 2.0)] * 5
    assert record["profile"]["source"] == "live (the pilot's steps)"
    coef = plan.sim.profile.fit.coefficients
    assert coef["intercept"] == pytest.approx(0.002, rel=0.02)
    assert coef["decode_seqs"] == pytest.approx(7e-4, rel=0.02)
    assert plan.sim.profile.identity == calibrated.profile.identity   # memory, identity kept
    # the pilot started from the calibration, which was simulated once more (to compete
    # with the refit); the whole search ran on the refit
    assert calibrated.fits[0] is calibrated.fits[1] is calibrated.profile.fit
    assert len(calibrated.fits) > 3 and all(f is plan.sim.profile.fit
                                            for f in calibrated.fits[2:])
    assert len(calls) == 1 + 2 * 2
    assert any("refitted from the pilot's" in line for line in logs)


def test_without_the_pilots_steps_the_calibration_stays(tmp_path, monkeypatch):
    _real(monkeypatch)
    monkeypatch.setattr(cs, "read_steps", lambda url, series, interval: lambda: None)
    logs = []
    plan = cs.CapacityPlan(sim=FakeSim(), sim_base={}, trials=4, real_probes=4,
                           log=logs.append)
    measure = cs.measure_capacity
    monkeypatch.setattr(cs, "measure_capacity", lambda *a, watch=None, **k: (
        watch and watch("http://engine:8000")(), measure(*a, **k))[1])
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    assert record["profile"]["source"] == "calibration"
    assert any("the calibration stays (0 busy window(s)" in line for line in logs)


@pytest.fixture(autouse=True)
def no_light_load(monkeypatch):
    """The pilot's light load needs a real engine: here it records nothing unless a test
    says otherwise."""
    monkeypatch.setattr(cs.capacity_front, "light_load", lambda url, load, slos, workdir: [])


def test_the_front_end_time_comes_from_the_pilots_light_load(tmp_path, monkeypatch):
    """After its capacity search the pilot's engine serves a light load (a tenth of the
    baseline's simulated capacity) whose median TTFT is 30.4 ms; the simulator, without
    front-end time, 10 ms at that rate: the 20.4 ms are added to every later simulated
    request (the search's and the arms')."""
    _real(monkeypatch)
    measure, light = cs.measure_capacity, []

    def measured(settings, launch, load, slos, *, watch=None, **kwargs):
        if watch is not None:   # the pilot: its engine watched, the light load at the end
            watch("http://engine:8000")()
        return measure(settings, launch, load, slos, **kwargs)
    monkeypatch.setattr(cs, "measure_capacity", measured)
    monkeypatch.setattr(cs, "read_steps", lambda url, series, interval: lambda: None)

    def light_load(url, load, slos, workdir):
        light.append((url, load.rate, load.arrival, workdir.name))
        return [{"kind": "chat", "ok": True, "ttft": 0.030 + j * 1e-4} for j in range(9)]
    monkeypatch.setattr(cs.capacity_front, "light_load", light_load)

    @dataclass
    class TimedSim(FakeSim):
        fronts: list = field(default_factory=list)   # the front of each capacity call
        ran: list = field(default_factory=list)

        def capacity(self, settings, *, start, **search):
            self.fronts.append(self.front_seconds)
            return super().capacity(settings, start=start, **search)

        def run(self, settings, rate):
            self.ran.append((settings, rate, self.front_seconds))
            records = [{"kind": "chat", "ok": True, "ttft": 0.010 + self.front_seconds}] * 5
            return SimpleNamespace(samples=SimpleNamespace(records=records))

    logs = []
    plan = cs.CapacityPlan(sim=TimedSim(), sim_base={"cpu_memory_gib": 0.5}, trials=4,
                           real_probes=4, log=logs.append, front=True)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    rate = cs.LIGHT_SHARE * FakeSim.truth({"max_num_seqs": 8})   # the baseline's, simulated
    assert light == [("http://engine:8000", pytest.approx(rate, rel=0.1), "open", "light")]
    want = 0.0304 - 0.010   # the real median less the simulated
    assert plan.sim.front_seconds == pytest.approx(want)
    assert record["profile"]["front_s"] == pytest.approx(want)
    (settings, at, front), = plan.sim.ran   # simulated once, without a front, at that rate
    assert (at, front) == (light[0][1], 0.0) and settings["cpu_memory_gib"] == 0.5
    assert plan.sim.fronts[0] == 0.0 and plan.sim.fronts[1:] and \
        all(f == pytest.approx(want) for f in plan.sim.fronts[1:])
    assert any(line.startswith("front-end time: 20.4 ms") for line in logs)


def test_a_pilot_without_a_light_load_adds_no_front_end_time(tmp_path, monkeypatch):
    _real(monkeypatch)   # its engine is never watched: no light load
    logs = []
    plan = cs.CapacityPlan(sim=FakeSim(), sim_base={}, trials=3, real_probes=4,
                           log=logs.append, front=True)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    assert record["profile"]["front_s"] == 0.0
    assert "front-end time: none added (the pilot's light load recorded no TTFT)" in logs


def test_without_the_flag_the_pilot_serves_no_light_load(tmp_path, monkeypatch):
    _real(monkeypatch)
    measure, asked = cs.measure_capacity, []
    monkeypatch.setattr(cs, "measure_capacity", lambda *a, watch=None, **k: (
        watch and watch("http://engine:8000")(), measure(*a, **k))[1])
    monkeypatch.setattr(cs, "read_steps", lambda url, series, interval: lambda: None)
    monkeypatch.setattr(cs.capacity_front, "light_load",
                        lambda *a: asked.append(a) or [{"ok": True, "ttft": 1.0}])
    logs = []
    plan = cs.CapacityPlan(sim=FakeSim(), sim_base={}, trials=3, real_probes=4,
                           log=logs.append)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    assert asked == [] and record["profile"]["front_s"] == 0.0
    assert not any(line.startswith("front-end time") for line in logs)


def test_each_arms_served_steps_are_priced_by_the_profile_the_search_ran_on(tmp_path,
                                                                           monkeypatch):
    """Every confirmation engine's step counters are read; the profile the search ran on
    (refitted on the pilot's steps) prices the baseline's steps at their time and a
    candidate whose engine steps 1.25x slower at 0.8 of theirs: a step-time error told
    apart from a scheduling one, per arm and round, in the record and the table."""
    from tuner.search.capacity_report import confirmation_table

    from test_capacity_profile import no_serving_term

    _real(monkeypatch)
    no_serving_term(monkeypatch)   # the refit, whose law is the steps' own
    slower = {"http://pilot": 1.0, "http://8": 1.0}   # the baseline (8 sequences); else 1.25

    def read_steps(url, series, interval):
        _steps_law(series, slower=slower.get(url, 1.25))
        return lambda: None
    monkeypatch.setattr(cs, "read_steps", read_steps)
    measure, pilot_done = cs.measure_capacity, []

    def measured(settings, launch, load, slos, *, watch=None, **kwargs):
        url = "http://pilot" if not pilot_done else f"http://{settings['max_num_seqs']}"
        pilot_done.append(True)
        if watch is not None:
            watch(url)()
        return measure(settings, launch, load, slos, **kwargs)
    monkeypatch.setattr(cs, "measure_capacity", measured)
    plan = cs.CapacityPlan(sim=FakeSim(refit_scale=0.5), sim_base={}, trials=6,
                           real_probes=4, log=lambda s: None)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=3), plan)
    base, cand = record["arms"]
    assert cand["params"]["max_num_seqs"] != 8 and len(base["step_price"]) == 3
    assert base["step_price"] == pytest.approx([1.0] * 3, abs=0.02)
    assert cand["step_price"] == pytest.approx([0.8] * 3, abs=0.02)
    table = confirmation_table(record)
    assert "steps priced" in table.splitlines()[0]
    # arm, simulated, three rounds, median, then the steps priced
    assert [line.split()[6] for line in table.splitlines()[1:3]] == ["1.00", "0.80"]
