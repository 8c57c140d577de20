"""The capacity sweep's search on the simulator (tuner/search/capacity_sweep.py, step 1):
Optuna's TPE proposes settings, each one's simulated capacity is the capacity search over
simulated loads warm-started at the best found so far; the best distinct ones become the
candidates measured for real."""
from __future__ import annotations

import time
from dataclasses import dataclass

import optuna

from paged_api import settings as engine_settings
from paged_api.search_space import Param, default_value
from tuner.measure.capacity import CapacityResult, interpolated
from tuner.search.sim_pool import SimPool

# a simulated gain worth real rounds: equally good settings simulate up to ~1 % apart (the
# crossing read between probes from different warm starts; SmolLM2 rag: 4.95 against the
# defaults' 4.92, and 0.65x for real); SmolLM2 summarize's 1.31x real simulated at 1.08x
HEADROOM = 1.03
SIM_REL_TOL = 0.1       # a simulated capacity is known to 10 %
SIM_GROWTH = 1.5        # bracketing step from the warm start
# probes per simulated capacity: a bracket from 1 req/s at 1.5x reaches 985 req/s in 17,
# then bisection to SIM_REL_TOL. At 10, a search from 1 req/s stopped at 1.5^9 = 38.44
# without a failing probe, and that was the embedded model's simulated chat baseline in
# every sweep (its pilot served 40-49 req/s; docs/benchmarks/tuning.md, 2026-12-05).
SIM_MAX_PROBES = 24


@dataclass
class SimPoint:
    params: dict
    capacity: float | None         # interpolated req/s; None: infeasible
    result: CapacityResult | None = None
    infeasible: str | None = None
    wall_s: float = 0.0


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def simulate_point(plan, settings: dict, *, start: float) -> SimPoint:
    """`plan`: a capacity_sweep.CapacityPlan (its simulator and base settings)."""
    wall = time.perf_counter()
    try:
        engine_settings.check_rules(settings)
        result = plan.sim.capacity({**plan.sim_base, **settings}, start=start,
                                   rel_tol=SIM_REL_TOL, growth=SIM_GROWTH,
                                   max_probes=SIM_MAX_PROBES)
    except ValueError as exc:   # the engine would refuse these settings
        return SimPoint(settings, None, infeasible=str(exc),
                        wall_s=time.perf_counter() - wall)
    return SimPoint(settings, interpolated(result), result, wall_s=time.perf_counter() - wall)


def simulated_search(plan, space: list[Param], *, fixed: dict, baseline: dict, seed: int,
                     start: float = 1.0) -> tuple[SimPoint, list[SimPoint]]:
    """(the baseline's simulated point, its search from `start` req/s; every searched
    point in order, each from the best capacity so far)."""
    base = simulate_point(plan, dict(baseline), start=start)
    if base.capacity is None:
        raise ValueError(f"the baseline settings are refused: {base.infeasible}")
    plan.log(f"simulated baseline {_describe(base.params)}: {base.capacity:.2f} req/s "
             f"({len(base.result.probes)} probes, {base.wall_s:.1f} s)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workers = max(1, min(plan.workers, plan.trials))   # no idle worker for a short sweep
    # a batch's later trials are asked before the earlier ones are told: the constant liar
    # keeps them apart
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=min(10, max(3, plan.trials // 3)),
        constant_liar=workers > 1))
    seen: dict[tuple, SimPoint] = {}
    points = []
    best = base.capacity
    if workers > 1 and plan.sim.replays_drafts and _drafts(space, fixed):
        # once, here: the forked workers inherit the replies and every method's drafts
        plan.sim.prepare_drafts(_speculating(space, fixed))
    with SimPool(plan, workers, simulate_point) as pool:
        for first in range(0, plan.trials, workers):
            trials = [study.ask() for _ in range(min(workers, plan.trials - first))]
            asked = [{p.name: p.suggest(trial) for p in space} for trial in trials]
            # the simulator is deterministic: a repeat (in this batch too) costs nothing
            fresh = {}
            for params in asked:
                if _key(params) not in seen:
                    fresh.setdefault(_key(params), params)
            start = max(best, 0.5)
            done = pool.map([({**fixed, **params}, start)
                             for params in fresh.values()])
            for (key, params), point in zip(fresh.items(), done):
                point.params = params
                seen[key] = point
            for number, trial, params in zip(range(first, first + len(trials)), trials, asked):
                point = seen[_key(params)]
                points.append(point)
                if point.capacity is None:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    plan.log(f"sim {number:>3} {_describe(params)} -> infeasible: "
                             f"{point.infeasible}")
                    continue
                study.tell(trial, point.capacity)
                best = max(best, point.capacity)
                plan.log(f"sim {number:>3} {_describe(params)} -> {point.capacity:.2f} req/s "
                         f"(best {best:.2f}; {point.wall_s:.1f} s)")
    return base, points


def _drafts(space: list[Param], fixed: dict) -> bool:
    """Whether a searched or fixed setting speculates (0 and None do not)."""
    if fixed.get("num_speculative_tokens"):
        return True
    for p in space:
        if p.name == "num_speculative_tokens":
            return (any(c for c in p.choices) if p.choices is not None
                    else (p.high or 0) > 0)
    return False


def _speculating(space: list[Param], fixed: dict) -> list[dict]:
    """The settings of each speculative choice the search can make (the fixed one where
    num_speculative_tokens is not searched, none for a continuous range)."""
    for p in space:
        if p.name == "num_speculative_tokens":
            return [{**fixed, p.name: v} for v in listed_values(p)]
    return [dict(fixed)]


def listed_values(p: Param) -> list:
    """A dimension's values, where it has a list of them (none for a continuous range)."""
    return list(p.choices) if p.choices is not None else ([] if p.log else p.grid_values())


def is_baseline(params: dict, baseline: dict) -> bool:
    """Whether these searched values are the baseline's (a dimension it leaves unset at
    the engine's default)."""
    return params == {n: baseline.get(n, default_value(n)) for n in params}


def _describe(params: dict) -> str:
    return " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in params.items()) or "(engine defaults)"


def candidates(points: list[SimPoint], k: int, baseline: dict) -> list[SimPoint]:
    """The k best distinct simulated settings, minus any that equal the baseline."""
    ranked, keys = [], set()
    for p in sorted((p for p in points if p.capacity is not None),
                    key=lambda p: p.capacity, reverse=True):
        if _key(p.params) in keys or is_baseline(p.params, baseline):
            continue
        keys.add(_key(p.params))
        ranked.append(p)
    return ranked[:k]
