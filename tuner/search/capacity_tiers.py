"""The host KV tier's size among the capacity sweep's candidates (tuner/search/
capacity_sweep.py): a tier costs host memory (in a cluster the operator adds it to the
container's) and pays only when the device pool evicts prefixes that come back; on a pool
that never fills every size simulates alike, and the search would keep whichever it met
first. So each candidate keeps the smallest size of the space that simulates as well."""
from __future__ import annotations

import dataclasses

from tuner.search.capacity_search import (HEADROOM, SimPoint, _describe, _key,
                                          is_baseline, listed_values, simulate_point)

TIER = "kv_offloading_size"   # the host KV tier's size, GiB


def tier_sizes(space) -> list[float]:
    """The host KV tier sizes the search space offers, smallest first ([] if none)."""
    return next((sorted(listed_values(p)) for p in space if p.name == TIER), [])


def smallest_tiers(plan, ranked: list[SimPoint], config, baseline: dict
                   ) -> tuple[list[SimPoint], list[SimPoint]]:
    """(the K candidates, the rest): the best distinct simulated settings, each with the
    smallest host KV tier of the space whose simulated capacity is within HEADROOM of its
    own, from the same start (a tier that is never used gives the same figure). A setting
    that becomes a chosen one's or the baseline's is skipped."""
    sizes, chosen, keys = tier_sizes(config.space), [], set()
    for i, point in enumerate(ranked):
        if len(chosen) == config.remeasure:
            return chosen, ranked[i:]
        size = point.params.get(TIER)
        if size and any(v < size for v in sizes):
            point = _trim_tier(plan, point, [v for v in sizes if v < size], config.fixed)
        if _key(point.params) in keys or is_baseline(point.params, baseline):
            continue
        keys.add(_key(point.params))
        chosen.append(point)
    return chosen, []


def _trim_tier(plan, point: SimPoint, smaller: list[float], fixed: dict
               ) -> SimPoint:
    size = point.params[TIER]
    own = simulate_point(plan, {**fixed, **point.params}, start=point.capacity)
    if own.capacity is None:
        return point
    for v in smaller:
        params = {**point.params, TIER: v}
        trial = simulate_point(plan, {**fixed, **params}, start=point.capacity)
        if trial.capacity is not None and trial.capacity * HEADROOM >= own.capacity:
            plan.log(f"host KV tier of {_describe(point.params)}: {v:g} GiB simulates "
                     f"{trial.capacity:.2f} req/s against {size:g} GiB's {own.capacity:.2f} "
                     f"(within {HEADROOM - 1:.0%}): {v:g} GiB kept")
            return dataclasses.replace(trial, params=params)
    return point
