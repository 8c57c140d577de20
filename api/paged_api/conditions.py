"""Status conditions of a PagedInferenceService, shared by the two writers of its status.

Conditions follow Kubernetes' conventions: type, status ("True"/"False"), reason
(CamelCase), message, observedGeneration and lastTransitionTime, where the time moves only
when the status flips, so that recomputing an unchanged state yields an identical dict.

Each writer owns its types and keeps the others' as it found them: the operator writes
Ready, Progressing and Degraded (operator/paged_operator/status.py), the SLO planner
Planning (tuner/planner/run.py).
"""
from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

OPERATOR_TYPES = ("Ready", "Progressing", "Degraded")
PLANNER_TYPE = "Planning"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, ok: bool, reason: str, message: str, *, generation: int | None,
              previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == type_), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status \
        else None
    cond = {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or now()}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def others(previous: Iterable[Mapping[str, Any]], owned: Iterable[str]) -> list[dict[str, Any]]:
    """The conditions of `previous` whose type another writer owns, as they were."""
    mine = set(owned)
    return [dict(c) for c in previous if c.get("type") not in mine]
