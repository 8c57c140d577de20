"""The sweep keeps the pilot's live refit only when it predicts the pilot's real capacity
at least as well as the calibration (tuner/search/capacity_profile.py)."""
from __future__ import annotations

import pytest

from test_capacity_sweep import FakeSim, _config, _real, _steps_law
from tuner.search import capacity_sweep as cs


@pytest.mark.parametrize("refit_scale, kept", [
    (0.5, "live (the pilot's steps)"),   # the refit predicts the real capacity (0.5 x truth)
    (3.0, "calibration"),                # the refit is further off than the calibration
])
def test_the_refit_is_kept_only_when_it_predicts_the_pilot_better(
        tmp_path, monkeypatch, refit_scale, kept):
    _real(monkeypatch, factor=0.5, noise=0.0)
    monkeypatch.setattr(cs, "read_steps", lambda url, series, interval: (
        _steps_law(series), lambda: None)[1])
    measure = cs.measure_capacity
    monkeypatch.setattr(cs, "measure_capacity", lambda *a, watch=None, **k: (
        watch and watch("http://engine:8000")(), measure(*a, **k))[1])
    sim = FakeSim(refit_scale=refit_scale)
    logs = []
    plan = cs.CapacityPlan(sim=sim, sim_base={}, trials=4, real_probes=4, log=logs.append)
    record = cs.run_capacity_sweep(_config(tmp_path, remeasure=1, rounds=2), plan)
    check = record["profile"]["check"]
    assert record["profile"]["source"] == kept
    truth = FakeSim.truth({"max_num_seqs": 8})
    assert check["pilot"] == pytest.approx(0.5 * truth, rel=0.1)
    assert check["calibration"] == pytest.approx(truth, rel=0.1)
    assert check["live"] == pytest.approx(refit_scale * truth, rel=0.1)
    assert (check["errors"]["live"] <= check["errors"]["calibration"]) == (kept != "calibration")
    # the search ran on the profile kept
    assert (plan.sim.profile is sim.calibration) == (kept == "calibration")
    word = "calibration" if kept == "calibration" else "refit"
    assert any("the pilot's real capacity" in line and f"the {word} is kept" in line
               for line in logs)
