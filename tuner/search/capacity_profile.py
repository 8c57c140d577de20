"""Which step-time profile a capacity sweep simulates with: the calibration, or the refit
from the pilot's served steps (tuner/sim/live_profile.py), whichever predicts the pilot's
real capacity better."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from tuner.sim.live_profile import live_profile


def live_refit(plan, series: list, *, real: float, calibrated: float | None,
               predict: Callable[[object], float | None]) -> None:
    """The simulator's profile (plan: a CapacityPlan) refitted from the pilot's steps when
    they are enough (else the calibration stays, and the log says why), and kept only if it
    predicts the pilot's real capacity `real` at least as well as the calibration did
    (`calibrated`; `predict(sim)`: the baseline's simulated capacity on that SimContext): a
    step-time fit can be close on the steps it saw and still miss the capacity
    (docs/benchmarks/tuning.md: the live refit was 27-38 % off where the calibration was
    14-18 %). Without a real capacity the refit is kept."""
    try:
        profile = live_profile(plan.sim.profile, series)
    except ValueError as exc:
        plan.log(f"profile: the calibration stays ({exc})")
        return
    plan.log(f"profile: refitted from the pilot's {profile.num_steps} served steps, form "
             f"{profile.fit.form}, held-out error {profile.fit.heldout_error:.1%} "
             f"(calibration: {plan.sim.profile.fit.form}, "
             f"{plan.sim.profile.fit.heldout_error:.1%})")
    refit = dataclasses.replace(plan.sim, profile=profile)
    if real > 0 and calibrated:
        live = predict(refit)
        errors = {"calibration": abs(calibrated - real) / real,
                  "live": abs(live - real) / real if live else math.inf}
        plan.profile_check = {"pilot": real, "calibration": calibrated, "live": live,
                              "errors": errors}
        keep = errors["live"] <= errors["calibration"]
        plan.log(f"profile: the pilot's real capacity {real:.2f} req/s, simulated "
                 f"{calibrated:.2f} by the calibration ({errors['calibration']:.0%} off) and "
                 f"{live or 0:.2f} by the refit ({errors['live']:.0%} off): the "
                 f"{'refit' if keep else 'calibration'} is kept")
        if not keep:
            return
    plan.sim = refit
    plan.live = True
