"""`python -m tuner sweep --objective capacity` (the default for this engine): maximise a
replica's SLO capacity, searched on the simulator, confirmed for real.

0. **Pilot** (with 2 or more rounds): the baseline once for real, not scored; its KV
   pool sizes the simulated pools, its served steps may refit the profile, and its real
   capacity sets the profile's step-time level (tuner/search/capacity_profile.py).
1. **Search in simulation** (tuner/sim/, tuner/search/capacity_search.py): Optuna's TPE
   proposes settings; each one's capacity is the capacity search (tuner/measure/
   capacity.py) over simulated loads of the workload's own arrival process, warm-started
   at the best capacity found so far. Every simulated load replays the same seeded
   stream, so settings differ by what they do. Settings the simulator does not model (the
   disk KV tier) stay at the baseline's value; the host tier's size is searched.
2. **Confirm for real**: the baseline (the engine defaults, or --baseline) and the best K
   distinct simulated settings are measured on real engines, R rounds interleaved
   (rotated order, one fresh engine per arm and round, the same request stream within a
   round). One measurement is a short real capacity search started at the arm's simulated
   capacity, scaled by its own real/simulated ratio so far (an arm's first measurement:
   the other arms' ratio, with more probes), in steps that start at 8 % and grow while
   the bracket is not found, read as the rate where attainment crosses the target
   (interpolated between the bracketing probes).
   The gain is the paired per-round capacity ratio with its 95 % t-interval
   (tuner/search/stats.py); a candidate replaces the baseline only when the lower bound
   exceeds --min-gain. Only these K+1 arms ever start a real engine; a candidate whose
   engine cannot start in the first round gives its place to the next simulated setting.
   A candidate's host KV tier is first cut to the smallest size of the space that
   simulates within HEADROOM of its capacity (tuner/search/capacity_tiers.py).
   When no candidate simulates more than HEADROOM (3 %) above the baseline there are no
   rounds: the decision keeps the baseline ("no headroom in simulation"), its real
   capacity the pilot's.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from tuner.measure.capacity import CapacityResult, interpolated, measure_capacity, rate_load
from tuner.search.capacity_latency import latency_comparison, twin
from tuner.search.stats import decide, paired_gain
from tuner.search import capacity_front
from tuner.search.capacity_search import (HEADROOM, SimPoint, _describe,
                                          candidates, simulate_point,
                                          simulated_search)
from tuner.search.capacity_tiers import smallest_tiers
from tuner.search.capacity_profile import anchor_time, fit_pool, live_refit, pool_blocks
from tuner.sim.live_profile import priced_share, read_steps
from tuner.sim.profile import UNFITTED

REAL_REL_TOL = 0.1
REAL_GROWTH = 1.08      # a real search starts near the answer: a small first step,
REAL_MAX_GROWTH = 2.0   # squared on each further step the same way (capacity.search_capacity)
LIGHT_SHARE = 0.1       # the pilot's light load, of its simulated capacity: no queueing
PILOT_DRIFT = 1.25      # a pilot this far from the baseline's rounds, and outside them


@dataclass
class CapacityPlan:
    """What a capacity sweep needs beyond the SweepConfig (tuner/search/sweep.py)."""
    sim: object                    # tuner.sim.context.SimContext
    sim_base: dict                 # settings every simulated engine starts with (CPU memory)
    trials: int = 16               # simulated settings
    workers: int = 1               # simulated at once, each in a process (sim_pool.py)
    real_probes: int = 4           # real loads per arm and round
    target_rate: float | None = None
    trace_rate: float | None = None
    log: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr))
    live: bool = False             # the profile was refitted from the pilot's steps
    profile_check: dict | None = None  # both profiles against the pilot (live_refit)
    front: bool = False            # measure the front-end time (capacity_front.py)
    pilot_start: float = 1.0       # the pilot's first rate when the profile times nothing
    pool_from_pilot: bool = False  # size the simulated pools from the pilot's (fit_pool)
    phase: Callable[[str], None] = field(default=lambda s: None)   # "Confirming", when it is
    source: str = "calibration"    # where plan.sim's profile came from, until a live refit
    pool: dict | None = None       # the pilot's KV pool against the profile's (fit_pool)
    anchor: dict | None = None     # the step times' factor from the pilot's capacity
    serving: dict | None = None    # the serving term the pilot's steps gave (live_refit)


def confirm_for_real(plan: CapacityPlan, config, arms: list[dict], pilot: dict,
                     spares: list | None = None) -> dict:
    """Measure every arm's real capacity `config.confirm_rounds` times, interleaved;
    arms: [{"label", "settings", "sim"}] with the baseline first; `pilot`: the baseline's
    unscored measurement (_pilot); `spares`: the next simulated settings (SimPoints, best
    first). A candidate whose engine cannot start in the first round (the simulator's
    memory model let through a pool the engine refuses) is replaced by the next spare
    there and then, and listed in its arm's `refused`. Returns the record: arms with their
    per-round capacities and probes, gains, the decision."""
    floor = _floor(config)
    ratios: dict[str, list[float]] = {}   # per arm: real / simulated capacity
    spares = list(spares or [])
    for arm in arms:
        arm.update(capacity=[], failed=[], probes=[], refused=[], step_price=[])
    if pilot["capacity"] > 0 and arms[0]["sim"] > 0:
        ratios[arms[0]["label"]] = [pilot["capacity"] / arms[0]["sim"]]
    for r in range(config.confirm_rounds):
        load = dataclasses.replace(config.load, seed=config.seed + 1 + r)
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            workdir = config.out_dir / "confirm" / f"round-{r}" / arm["label"]
            try:
                while True:
                    series: list = []
                    try:
                        result = _measure_arm(plan, config, arm, load, ratios, workdir,
                                              series)
                        break
                    except _infeasible() as exc:
                        if r > 0 or arm is arms[0] or not spares:
                            raise
                        spare = spares.pop(0)
                        plan.log(f"round 1 {arm['label']}: {_describe(arm['params'])} cannot "
                                 f"start ({exc.reason}); the next simulated setting, "
                                 f"{_describe(spare.params)}, replaces it")
                        arm["refused"].append({"params": arm["params"], "reason": exc.reason})
                        arm.update(params=spare.params, sim=spare.capacity,
                                   settings={**config.fixed, **spare.params})
            except _infeasible() as exc:
                arm["capacity"].append(0.0)
                arm["failed"].append(exc.reason)
                arm["probes"].append([])
                arm["step_price"].append(None)
                plan.log(f"round {r + 1} {arm['label']:>8}: failed: {exc.reason}")
                continue
            rate = interpolated(result)
            arm["capacity"].append(rate)
            arm["failed"].append(None)
            arm["probes"].append(result.probes)
            if rate > 0 and arm["sim"] > 0:
                ratios.setdefault(arm["label"], []).append(rate / arm["sim"])
            price = priced_share(plan.sim.profile.fit, series)
            arm["step_price"].append(price)
            plan.log(f"round {r + 1}/{config.confirm_rounds} {arm['label']:>8}: "
                     f"{rate:.2f} req/s real (simulated {arm['sim']:.2f}; probes "
                     + ", ".join(f"{p['rate']:.2f}{'+' if p['passed'] else '-'}"
                                 for p in result.probes)
                     + ("" if price is None else
                        f"; the profile prices its served steps at {price:.2f} of their time")
                     + ")")
    base = arms[0]
    gains = {}
    for arm in arms[1:]:
        usable = not any(arm["failed"]) and not any(base["failed"])
        gains[arm["label"]] = (paired_gain(base["capacity"], arm["capacity"], floor=floor)
                               if usable else None)
        arm["gain"] = dataclasses.asdict(gains[arm["label"]]) if usable else None
    decision = decide(gains, min_gain=config.min_gain)
    drift = pilot_drift(pilot, base)
    if drift and drift["flagged"]:
        plan.log(drift_text(drift))
    return {"arms": arms, "rounds": config.confirm_rounds, "floor": floor, "pilot": pilot,
            "pilot_drift": drift, "winner": decision.winner, "reason": decision.reason}


def pilot_drift(pilot: dict, base: dict) -> dict | None:
    """The pilot against the baseline's real rounds. The profile's serving term, its
    pools and its anchor are fitted on the pilot's engine, so a pilot measured while the
    machine ran at another speed fits them to that speed, and the search ranked the
    settings on it (a fresh VM's first minutes, 2026-12-07: the defaults' pilot 22.47
    req/s, the same defaults 45.30 twenty minutes later). Flagged when the pilot lies
    outside the rounds and more than PILOT_DRIFT from their median; None without a
    pilot or a round."""
    rounds = [c for c, failed in zip(base["capacity"], base["failed"])
              if failed is None and c > 0]
    if pilot.get("failed") or not pilot.get("capacity") or not rounds:
        return None
    median = statistics.median(rounds)
    ratio = pilot["capacity"] / median
    outside = not min(rounds) <= pilot["capacity"] <= max(rounds)
    return {"ratio": ratio, "baseline_median": median,
            "flagged": outside and not 1 / PILOT_DRIFT <= ratio <= PILOT_DRIFT}


def drift_text(drift: dict) -> str:
    return (f"the pilot read {drift['ratio']:.2f}x the baseline's rounds (median "
            f"{drift['baseline_median']:.2f} req/s): the machine ran at another speed while "
            "it measured, and the simulator's serving term, pools and anchor were fitted to "
            "that speed; the simulated ranking may be off: run the sweep again on a quiet "
            "machine")


def _measure_arm(plan: CapacityPlan, config, arm: dict, load, ratios: dict[str, list[float]],
                 workdir, series: list) -> CapacityResult:
    """One real capacity search of `arm`, started at its simulated capacity times its own
    real/simulated ratio so far (the median of its real capacities so far), in steps that
    start small (REAL_GROWTH) and square while the bracket is not found (to 2x at most):
    an arm whose capacity moved less than a step since its last round brackets in two
    probes, where 1.25x steps then a bisection to 10 % took four (every round of the
    README's command, 2026-12-06). An arm not yet measured starts at the other arms' ratio
    and has three probes more: the simulator can be off by another factor for other
    settings (a profile fitted on one sequence at a time put 8 sequences at 91 req/s,
    their engine served 40: three probes of 1.25x steps down from 96 all failed). Its
    engine's step counters are read into `series` meanwhile: what the simulator's profile
    charges for the steps it served, against what they took (live_profile.priced_share),
    tells a step-time error from a scheduling one for each arm."""
    own = ratios.get(arm["label"])
    pooled = [r for rs in ratios.values() for r in rs]
    scale = statistics.median(own or pooled) if own or pooled else 1.0
    guess = max(arm["sim"] * scale, _floor(config))
    wide = not own
    return measure_capacity(
        {**config.fixed, **arm["settings"]}, config.launch, load, config.slos,
        workdir=workdir, start=guess, trace_rate=plan.trace_rate,
        warmup_requests=config.warmup_requests, warmup_load=plan.sim.warmup_requests,
        attainment=plan.sim.attainment, sustain=plan.sim.sustain, rel_tol=REAL_REL_TOL,
        growth=REAL_GROWTH, max_growth=REAL_MAX_GROWTH,
        max_probes=plan.real_probes + (3 if wide else 0),
        watch=lambda url: read_steps(url, series, _step_interval(config)))


def _step_interval(config) -> float:
    """Seconds between two readings of an engine's step counters: five per load window."""
    return max(0.5, config.load.duration / 5)


def _floor(config) -> float:
    return 0.5 / config.load.duration   # half a request per load window


def _pilot(plan: CapacityPlan, config, settings: dict, sim: float) -> dict:
    """The baseline's real capacity once, widely bracketed from its simulated one `sim`,
    before the search and not scored. Its engine's step counters are read meanwhile
    (tuner/sim/live_profile.py: "series"), so the search can run on steps as served; it
    gives every round's search the real/simulated ratio to start from, so all rounds
    search alike (a first round that brackets widely from a far guess reads its crossing
    less precisely); and it is the sweep's first engine: whatever a cold machine costs
    (weights off disk, first compilations) is paid here. Its stream (config.seed) is none
    of the rounds' (seed + 1 + r). After the search its engine serves one light load (a
    tenth of `sim`: "light"), whose TTFTs give the simulator its front-end time."""
    load = dataclasses.replace(config.load, seed=config.seed)
    series: list = []
    light: dict = {"rate": max(LIGHT_SHARE * sim, _floor(config))}

    def watch(url: str) -> Callable[[], None]:
        if plan.pool_from_pilot:
            light["blocks"] = pool_blocks(url)
        stop_reading = read_steps(url, series, _step_interval(config))

        def stop() -> None:
            if not plan.front:
                stop_reading()
                return
            try:
                light["records"] = capacity_front.light_load(
                    url, rate_load(load, light["rate"], trace_rate=plan.trace_rate),
                    config.slos, config.out_dir / "confirm" / "pilot" / "light")
            except Exception as exc:   # noqa: BLE001 - the front-end time is then unknown
                light["error"] = str(exc)
            finally:
                stop_reading()
        return stop
    try:
        result = measure_capacity(
            {**config.fixed, **settings}, config.launch, load, config.slos,
            workdir=config.out_dir / "confirm" / "pilot", start=max(sim, _floor(config)),
            trace_rate=plan.trace_rate, warmup_requests=config.warmup_requests,
            warmup_load=plan.sim.warmup_requests,
            attainment=plan.sim.attainment, sustain=plan.sim.sustain, rel_tol=REAL_REL_TOL,
            growth=2.0,
            max_probes=plan.real_probes + 3, watch=watch)
    except _infeasible() as exc:
        plan.log(f"pilot baseline: failed: {exc.reason}; the first round brackets widely")
        return {"capacity": 0.0, "probes": [], "failed": exc.reason, "series": [],
                "light": light}
    rate = interpolated(result)
    plan.log(f"pilot baseline: {rate:.2f} req/s real (simulated {sim:.2f}; not scored; "
             "probes " + ", ".join(f"{p['rate']:.2f}{'+' if p['passed'] else '-'}"
                                   for p in result.probes) + ")")
    return {"capacity": rate, "probes": result.probes, "failed": None, "series": series,
            "light": light}


def _infeasible():
    from tuner.measure.runner import Infeasible
    return Infeasible


def no_headroom(baseline: float | None, arms: list[dict]) -> str | None:
    """Why no candidate is worth a real round: none simulates above the baseline by more
    than HEADROOM (None: the best one does, or the baseline's simulated capacity is
    unknown)."""
    if not baseline or not arms or max(a["sim"] for a in arms) > HEADROOM * baseline:
        return None
    best = max(arms, key=lambda a: a["sim"])
    return (f"no headroom in simulation: the best simulated setting ({_describe(best['params'])}) "
            f"serves {best['sim']:.3g} req/s against the baseline's {baseline:.3g}")


def replicas(target: float | None, rate: float) -> int | None:
    """Replicas `target` req/s needs at `rate` req/s each (None: no target or no rate)."""
    if not target or not rate > 0:
        return None
    return math.ceil(target / rate - 1e-9)


def run_capacity_sweep(config, plan: CapacityPlan) -> dict:
    """The whole sweep; returns the record the report prints (tuner/search/capacity_report)."""
    baseline = config.baseline
    plan.log(f"capacity sweep: {plan.trials} simulated settings, then the best "
             f"{config.remeasure} and the baseline ({baseline.source}) measured for real over "
             f"{config.confirm_rounds} interleaved rounds")
    pilot = None
    timed = plan.sim.profile.fit.form != UNFITTED   # else only the pilot's steps time it
    if config.confirm_rounds >= 2:   # the baseline for real first: its steps, as served
        first = simulate_point(plan, dict(baseline.settings), start=1.0) if timed \
            else SimPoint(baseline.settings, plan.pilot_start)
        if first.capacity is None:
            raise ValueError(f"the baseline settings are refused: {first.infeasible}")
        pilot = _pilot(plan, config, baseline.settings, first.capacity)
        light = pilot.pop("light")
        if plan.pool_from_pilot and light.get("blocks"):
            fit_pool(plan, light["blocks"], {**plan.sim_base, **baseline.settings})
        # every later simulation of the baseline starts where its pilot measured: a
        # simulated capacity near its knee depends on the rates probed (a short window's
        # attainment is not monotone in the rate), so one start keeps the figure the anchor
        # compared, the one the search reads and the one the candidates beat the same
        # (agentic, 2026-12-05: 1.47 req/s from the pilot's 1.54, 1.22 from 1 req/s)
        base_start = pilot["capacity"] or first.capacity

        def predict(sim) -> float | None:   # the baseline's simulated capacity on `sim`
            return simulate_point(dataclasses.replace(plan, sim=sim),
                                  dict(baseline.settings), start=base_start).capacity
        live_refit(plan, pilot.pop("series"), real=pilot["capacity"], calibrated=timed,
                   predict=predict)
        if plan.front:
            capacity_front.calibrate_front(
                plan, {**plan.sim_base, **dict(baseline.settings)}, light)
        if plan.sim.profile.fit.form != UNFITTED:
            anchor_time(plan, real=pilot["capacity"], simulated=predict(plan.sim),
                        predict=predict)
    if plan.sim.profile.fit.form == UNFITTED:
        raise ValueError("no step-time profile: none is cached for this model, and the "
                         "pilot's served steps were too few to fit one; lengthen the trials' "
                         "load (trialDuration) or give a calibrated profile")
    wall = time.perf_counter()
    base, points = simulated_search(plan, config.space, fixed=config.fixed,
                                    baseline=baseline.settings, seed=config.seed,
                                    start=base_start if pilot else 1.0)
    sim_wall = time.perf_counter() - wall
    ranked = candidates(points, len(points), baseline.params)
    chosen, spares = smallest_tiers(plan, ranked, config, baseline.params)
    arms = [{"label": "baseline", "params": baseline.params, "settings": baseline.settings,
             "sim": base.capacity}]
    arms += [{"label": f"C{i}", "params": p.params, "settings": {**config.fixed, **p.params},
              "sim": p.capacity} for i, p in enumerate(chosen, start=1)]
    record = {"simulated": [{"params": p.params, "capacity": p.capacity,
                             "infeasible": p.infeasible, "wall_s": round(p.wall_s, 3)}
                            for p in points],
              "sim_baseline": base.capacity, "sim_wall_s": sim_wall,
              "sim_duration_s": plan.sim.duration,
              "attainment": plan.sim.attainment, "sustain_s": plan.sim.sustain,
              "target_rate": plan.target_rate,
              "profile": {"form": plan.sim.profile.fit.form,
                          "heldout_error": plan.sim.profile.fit.heldout_error,
                          # seconds per step and per unit of each figure, after the anchor
                          "coefficients": dict(plan.sim.profile.fit.coefficients),
                          "front_s": plan.sim.front_seconds,
                          "source": "live (the pilot's steps)" if plan.live
                          else plan.source, "check": plan.profile_check,
                          "pool": plan.pool, "anchor": plan.anchor,
                          "serving": plan.serving}}
    if len(arms) == 1 or config.confirm_rounds < 2:
        record.update(arms=arms, rounds=0, winner=None,
                      reason="no candidate differs from the baseline" if len(arms) == 1
                      else "not confirmed (--confirm-rounds 0): simulated figures only")
        return record
    flat = no_headroom(base.capacity, arms[1:])
    if flat and pilot is not None and not pilot["failed"]:
        # nothing the simulator rates above the baseline: the rounds would measure settings
        # expected to lose; the baseline's real figure is its pilot's
        base_arm = arms[0]
        base_arm.update(capacity=[pilot["capacity"]], failed=[None], probes=[pilot["probes"]],
                        refused=[])
        record.update(arms=[base_arm], rounds=0, winner=None, pilot=pilot, real_engines=1,
                      reason=flat)
        plan.log(f"no confirmation: {flat}")
        return record
    plan.phase("Confirming")
    record.update(confirm_for_real(plan, config, arms, pilot, spares))
    record["real_engines"] = 1 + sum(len(a["capacity"]) for a in arms)   # the pilot too
    record["latency"] = latency_comparison(
        twin(plan.sim, plan.sim_base), config.out_dir / "confirm" / f"round-{config.confirm_rounds - 1}", arms,
        config.confirm_rounds - 1)
    return record


__all__ = ["CapacityPlan", "SimPoint", "candidates", "confirm_for_real", "replicas",
           "run_capacity_sweep", "simulated_search"]
