"""`python -m tuner sweep --objective capacity` (the default for this engine): maximise a
replica's SLO capacity, searched on the simulator, confirmed for real.

1. **Search in simulation** (tuner/sim/): Optuna's TPE proposes settings; each one's
   capacity is the capacity search (tuner/measure/capacity.py) over simulated loads of the
   workload's own arrival process, warm-started at the best capacity found so far. Every
   simulated load replays the same seeded stream, so settings differ by what they do.
   Settings the simulator does not model (the KV host tier) stay at the baseline's value.
2. **Confirm for real**: the baseline (the engine defaults, or --baseline) and the best K
   distinct simulated settings are measured on real engines, R rounds interleaved
   (rotated order, one fresh engine per arm and round, the same request stream within a
   round). One measurement is a short real capacity search started at the arm's simulated
   capacity, scaled by what the real/simulated ratio has been so far, read as the rate
   where attainment crosses the target (interpolated between the bracketing probes).
   The gain is the paired per-round capacity ratio with its 95 % t-interval
   (tuner/search/stats.py); a candidate replaces the baseline only when the lower bound
   exceeds --min-gain. Only these K+1 arms ever start a real engine.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import optuna

from paged_api import settings as engine_settings
from paged_api.search_space import Param, default_value
from tuner.measure.capacity import CapacityResult, interpolated, measure_capacity, rate_load
from tuner.search.capacity_latency import latency_comparison
from tuner.search.stats import decide, paired_gain
from tuner.search import capacity_front
from tuner.search.capacity_profile import fit_pool, live_refit, pool_blocks
from tuner.sim.live_profile import read_steps
from tuner.sim.profile import UNFITTED

SIM_UNMODELLED = ("kv_offloading_size",)   # tiers are not simulated (tuner/sim/engine.py)
SIM_REL_TOL = 0.1       # a simulated capacity is known to 10 %
SIM_GROWTH = 1.5        # bracketing step from the warm start
REAL_REL_TOL = 0.1
REAL_GROWTH = 1.25      # a real search starts near the answer: small steps
LIGHT_SHARE = 0.1       # the pilot's light load, of its simulated capacity: no queueing


@dataclass
class CapacityPlan:
    """What a capacity sweep needs beyond the SweepConfig (tuner/search/sweep.py)."""
    sim: object                    # tuner.sim.context.SimContext
    sim_base: dict                 # settings every simulated engine starts with (CPU memory)
    trials: int = 16               # simulated settings
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


@dataclass
class SimPoint:
    params: dict
    capacity: float | None         # interpolated req/s; None: infeasible
    result: CapacityResult | None = None
    infeasible: str | None = None
    wall_s: float = 0.0


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def simulate_point(plan: CapacityPlan, settings: dict, *, start: float) -> SimPoint:
    wall = time.perf_counter()
    try:
        engine_settings.check_rules(settings)
        result = plan.sim.capacity({**plan.sim_base, **settings}, start=start,
                                   rel_tol=SIM_REL_TOL, growth=SIM_GROWTH, max_probes=10)
    except ValueError as exc:   # the engine would refuse these settings
        return SimPoint(settings, None, infeasible=str(exc),
                        wall_s=time.perf_counter() - wall)
    return SimPoint(settings, interpolated(result), result, wall_s=time.perf_counter() - wall)


def simulated_search(plan: CapacityPlan, space: list[Param], *, fixed: dict,
                     baseline: dict, seed: int) -> tuple[SimPoint, list[SimPoint]]:
    """(the baseline's simulated point, every searched point in order)."""
    space = [p for p in space if p.name not in SIM_UNMODELLED]
    base = simulate_point(plan, _sim_settings(baseline), start=1.0)
    if base.capacity is None:
        raise ValueError(f"the baseline settings are refused: {base.infeasible}")
    plan.log(f"simulated baseline {_describe(base.params)}: {base.capacity:.2f} req/s "
             f"({len(base.result.probes)} probes, {base.wall_s:.1f} s)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=min(10, max(3, plan.trials // 3))))
    seen: dict[tuple, SimPoint] = {}
    points = []
    best = base.capacity
    for number in range(plan.trials):
        trial = study.ask()
        params = {p.name: p.suggest(trial) for p in space}
        point = seen.get(_key(params))
        if point is None:   # the simulator is deterministic: a repeat costs nothing
            settings = _sim_settings({**fixed, **params})
            point = simulate_point(plan, settings, start=max(best, 0.5))
            point.params = params
            seen[_key(params)] = point
        points.append(point)
        if point.capacity is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            plan.log(f"sim {number:>3} {_describe(params)} -> infeasible: {point.infeasible}")
            continue
        study.tell(trial, point.capacity)
        best = max(best, point.capacity)
        plan.log(f"sim {number:>3} {_describe(params)} -> {point.capacity:.2f} req/s "
                 f"(best {best:.2f}; {point.wall_s:.1f} s)")
    return base, points


def _sim_settings(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in SIM_UNMODELLED}


def _describe(params: dict) -> str:
    return " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in params.items()) or "(engine defaults)"


def candidates(points: list[SimPoint], k: int, baseline: dict) -> list[SimPoint]:
    """The k best distinct simulated settings, minus any that equal the baseline."""
    ranked, keys = [], set()
    for p in sorted((p for p in points if p.capacity is not None),
                    key=lambda p: p.capacity, reverse=True):
        same = {n: baseline.get(n, default_value(n)) for n in p.params}
        if _key(p.params) in keys or p.params == same:
            continue
        keys.add(_key(p.params))
        ranked.append(p)
    return ranked[:k]


def confirm_for_real(plan: CapacityPlan, config, arms: list[dict], pilot: dict) -> dict:
    """Measure every arm's real capacity `config.confirm_rounds` times, interleaved;
    arms: [{"label", "settings", "sim"}] with the baseline first; `pilot`: the baseline's
    unscored measurement (_pilot). Returns the record: arms with their per-round
    capacities and probes, gains, the decision."""
    floor = _floor(config)
    ratios: list[float] = []
    for arm in arms:
        arm.update(capacity=[], failed=[], probes=[])
    if pilot["capacity"] > 0 and arms[0]["sim"] > 0:
        ratios.append(pilot["capacity"] / arms[0]["sim"])
    for r in range(config.confirm_rounds):
        load = dataclasses.replace(config.load, seed=config.seed + 1 + r)
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            scale = statistics.median(ratios) if ratios else 1.0
            guess = max(arm["sim"] * scale, floor)
            # until one real capacity is known the simulated one may be far off (the
            # profile times steps, not the HTTP serving around them): bracket widely
            wide = not ratios
            workdir = config.out_dir / "confirm" / f"round-{r}" / arm["label"]
            try:
                result = measure_capacity(
                    {**config.fixed, **arm["settings"]}, config.launch, load, config.slos,
                    workdir=workdir, start=guess, trace_rate=plan.trace_rate,
                    warmup_requests=config.warmup_requests, attainment=plan.sim.attainment,
                    rel_tol=REAL_REL_TOL, growth=2.0 if wide else REAL_GROWTH,
                    max_probes=plan.real_probes + (3 if wide else 0))
            except _infeasible() as exc:
                arm["capacity"].append(0.0)
                arm["failed"].append(exc.reason)
                arm["probes"].append([])
                plan.log(f"round {r + 1} {arm['label']:>8}: failed: {exc.reason}")
                continue
            rate = interpolated(result)
            arm["capacity"].append(rate)
            arm["failed"].append(None)
            arm["probes"].append(result.probes)
            if rate > 0 and arm["sim"] > 0:
                ratios.append(rate / arm["sim"])
            plan.log(f"round {r + 1}/{config.confirm_rounds} {arm['label']:>8}: "
                     f"{rate:.2f} req/s real (simulated {arm['sim']:.2f}; probes "
                     + ", ".join(f"{p['rate']:.2f}{'+' if p['passed'] else '-'}"
                                 for p in result.probes) + ")")
    base = arms[0]
    gains = {}
    for arm in arms[1:]:
        usable = not any(arm["failed"]) and not any(base["failed"])
        gains[arm["label"]] = (paired_gain(base["capacity"], arm["capacity"], floor=floor)
                               if usable else None)
        arm["gain"] = dataclasses.asdict(gains[arm["label"]]) if usable else None
    decision = decide(gains, min_gain=config.min_gain)
    return {"arms": arms, "rounds": config.confirm_rounds, "floor": floor, "pilot": pilot,
            "winner": decision.winner, "reason": decision.reason}


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
        stop_reading = read_steps(url, series, max(0.5, config.load.duration / 5))

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
            attainment=plan.sim.attainment, rel_tol=REAL_REL_TOL, growth=2.0,
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
    dropped = [p.name for p in config.space if p.name in SIM_UNMODELLED]
    if dropped:
        plan.log(f"not searched: {', '.join(dropped)} (the simulator does not model KV tiers;"
                 " --objective goodput searches them on real engines)")
    pilot = None
    timed = plan.sim.profile.fit.form != UNFITTED   # else only the pilot's steps time it
    if config.confirm_rounds >= 2:   # the baseline for real first: its steps, as served
        first = simulate_point(plan, _sim_settings(baseline.settings), start=1.0) if timed \
            else SimPoint(baseline.settings, plan.pilot_start)
        if first.capacity is None:
            raise ValueError(f"the baseline settings are refused: {first.infeasible}")
        pilot = _pilot(plan, config, baseline.settings, first.capacity)
        light = pilot.pop("light")
        if plan.pool_from_pilot and light.get("blocks"):
            fit_pool(plan, light["blocks"], {**plan.sim_base, **baseline.settings})
        live_refit(plan, pilot.pop("series"), real=pilot["capacity"],
                   calibrated=first.capacity if timed else None,
                   predict=lambda sim: simulate_point(
                       dataclasses.replace(plan, sim=sim), _sim_settings(baseline.settings),
                       start=first.capacity).capacity)
        if plan.front:
            capacity_front.calibrate_front(
                plan, {**plan.sim_base, **_sim_settings(baseline.settings)}, light)
    if plan.sim.profile.fit.form == UNFITTED:
        raise ValueError("no step-time profile: none is cached for this model, and the "
                         "pilot's served steps were too few to fit one; lengthen the trials' "
                         "load (trialDuration) or give a calibrated profile")
    wall = time.perf_counter()
    base, points = simulated_search(plan, config.space, fixed=config.fixed,
                                    baseline=baseline.settings, seed=config.seed)
    sim_wall = time.perf_counter() - wall
    chosen = candidates(points, config.remeasure, baseline.params)
    arms = [{"label": "baseline", "params": baseline.params, "settings": baseline.settings,
             "sim": base.capacity}]
    arms += [{"label": f"C{i}", "params": p.params, "settings": {**config.fixed, **p.params},
              "sim": p.capacity} for i, p in enumerate(chosen, start=1)]
    record = {"simulated": [{"params": p.params, "capacity": p.capacity,
                             "infeasible": p.infeasible, "wall_s": round(p.wall_s, 3)}
                            for p in points],
              "sim_baseline": base.capacity, "sim_wall_s": sim_wall,
              "attainment": plan.sim.attainment, "target_rate": plan.target_rate,
              "profile": {"form": plan.sim.profile.fit.form,
                          "heldout_error": plan.sim.profile.fit.heldout_error,
                          "front_s": plan.sim.front_seconds,
                          "source": "live (the pilot's steps)" if plan.live
                          else plan.source, "check": plan.profile_check}}
    if len(arms) == 1 or config.confirm_rounds < 2:
        record.update(arms=arms, rounds=0, winner=None,
                      reason="no candidate differs from the baseline" if len(arms) == 1
                      else "not confirmed (--confirm-rounds 0): simulated figures only")
        return record
    plan.phase("Confirming")
    record.update(confirm_for_real(plan, config, arms, pilot))
    record["real_engines"] = 1 + sum(len(a["capacity"]) for a in arms)   # the pilot too
    record["latency"] = latency_comparison(
        lambda settings, rate: plan.sim.run({**plan.sim_base, **_sim_settings(settings)}, rate),
        config.out_dir / "confirm" / f"round-{config.confirm_rounds - 1}", arms,
        config.confirm_rounds - 1)
    return record


__all__ = ["CapacityPlan", "SimPoint", "candidates", "confirm_for_real", "replicas",
           "run_capacity_sweep", "simulated_search"]
