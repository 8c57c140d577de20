"""The host KV tier (spec.kvCache.offloadGiB) in the in-cluster tuning: the Job's default
space with the workload's opt-in dimensions, and the settings outside spec.engine
(space.OUTSIDE_ENGINE) that the Job searches, read from the target for the baseline and
patched onto it by Auto beside spec.engine, keeping the target's disk tier."""
from __future__ import annotations

import dataclasses
from typing import Any

from loadtests.workloads import get_workload
from paged_operator.contract import TuningSpec, search_space
from engine.search_space import (OUTSIDE_ENGINE, Param, default_value, engine_values,
                                 from_outside_spec, to_engine_spec)


def with_opt_in(tuning: TuningSpec, spec: dict[str, Any]) -> TuningSpec:
    """The Job's space: with spec.searchSpace unset, the named workload's tune_also joins
    the table's defaults (chat, the default, and rag: kv_offloading_size); a workload from
    workloadFrom adds none (its revisits are unknown). The operator's parse_tuning gives the
    defaults alone: its image holds the workloads' names, not their definitions."""
    if spec.get("searchSpace") is not None or tuning.workload_from is not None:
        return tuning
    also = get_workload(tuning.workload).tune_also
    return dataclasses.replace(tuning, space=search_space(None, also)) if also else tuning


def outside_baseline(target_spec: dict[str, Any], space: tuple[Param, ...]) -> dict[str, Any]:
    """The target's OUTSIDE_ENGINE settings the space varies: its own value, else the
    engine's default (kv_offloading_size 0: no host tier), so that a candidate equal to the
    target's current settings is not taken for a change."""
    have = from_outside_spec(target_spec, where="the target's spec")
    return {p.name: have.get(p.name, default_value(p.name))
            for p in space if p.name in OUTSIDE_ENGINE}


def kv_change(live_spec: dict[str, Any], wanted: dict[str, Any] | None
              ) -> tuple[dict, dict | None] | None:
    """`wanted`: the winner's spec.kvCache patch ({"offloadGiB": GiB or None: off}) or None.
    -> (the merge patch of spec.kvCache, what rolls it back), or None when nothing changes.
    The rollback is {"offloadGiB": before} (None removes it; the disk tier stays), or None
    (remove spec.kvCache) when the target had no kvCache at all."""
    if not wanted:
        return None
    live = live_spec.get("kvCache")
    live = live if isinstance(live, dict) else None
    change = {k: v for k, v in wanted.items() if (live or {}).get(k) != v}
    if not change:
        return None
    return change, None if live is None else {k: live.get(k) for k in change}


def trial_spec(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's settings as status.history and the confirmation show them: `engine`
    (spec.engine's keys) and, when the space varies a setting outside spec.engine,
    `kvCache` with it (offloadGiB 0: no host tier), so a line names everything it ran."""
    out: dict[str, Any] = {"engine": to_engine_spec(params)}
    values = engine_values(params)
    for name, (section, key) in OUTSIDE_ENGINE.items():
        if name in params:
            value = values[name]
            out.setdefault(section, {})[key] = 0 if value is None else float(value)
    return out
