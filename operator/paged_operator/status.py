"""The status of a PagedInferenceService, derived from its Deployment's real state.

Conditions follow Kubernetes' conventions: type, status ("True"/"False"), reason
(CamelCase), message, observedGeneration and lastTransitionTime, where the time moves only
when the status flips, so that recomputing an unchanged state yields an identical dict.
"""
from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from . import manifests
from .spec import ServiceSpec


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(type_: str, ok: bool, reason: str, message: str, *, generation: int | None,
               previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == type_), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status \
        else None
    cond = {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or _now()}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def _deployment_failure(deployment: Mapping[str, Any]) -> str | None:
    for cond in deployment.get("status", {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return cond.get("message") or "replica failure"
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return cond.get("message") or "the rollout exceeded its progress deadline"
    return None


def from_deployment(spec: ServiceSpec, deployment: Mapping[str, Any], *,
                    generation: int | None, previous: Mapping[str, Any]) -> dict[str, Any]:
    """Status for a valid spec whose children were applied."""
    conditions = previous.get("conditions") or []
    dspec = deployment.get("spec", {})
    dstatus = deployment.get("status", {})
    desired = int(dspec.get("replicas", spec.replicas))
    ready = int(dstatus.get("readyReplicas") or 0)
    updated = int(dstatus.get("updatedReplicas") or 0)
    total = int(dstatus.get("replicas") or 0)
    seen = dstatus.get("observedGeneration")
    current = deployment.get("metadata", {}).get("generation")
    caught_up = seen is None or current is None or int(seen) >= int(current)
    rolled_out = caught_up and updated >= desired and total <= desired and ready >= desired
    failure = _deployment_failure(deployment)
    counts = f"{ready}/{desired} replicas ready, {updated}/{desired} updated"

    if desired == 0:
        ready_cond = (False, "ScaledToZero", "spec.replicas is 0")
    elif ready >= desired and caught_up:
        ready_cond = (True, "AllReplicasReady", counts)
    else:
        ready_cond = (False, "ReplicasNotReady", counts)
    progressing = (not rolled_out, "RollingOut" if not rolled_out else "RolloutComplete", counts)
    degraded = (failure is not None, "DeploymentFailing" if failure else "AsExpected",
                failure or "no failures reported")
    kw = {"generation": generation, "previous": conditions}
    return {
        "conditions": [_condition("Ready", *ready_cond, **kw),
                       _condition("Progressing", *progressing, **kw),
                       _condition("Degraded", *degraded, **kw)],
        "observedGeneration": generation,
        "replicas": total,
        "readyReplicas": ready,
        "selector": ",".join(f"{k}={v}" for k, v in
                             sorted(manifests.selector_labels(spec.name).items())),
        "endpoint": manifests.endpoint(spec),
        "servedModelName": spec.model.served_name,
        "engine": spec.engine.applied(),
    }


def degraded(message: str, *, reason: str, generation: int | None,
             previous: Mapping[str, Any]) -> dict[str, Any]:
    """Status for a spec that cannot be served (or children the API refused).

    Ready and Progressing keep what an earlier valid spec produced: its pods still serve.
    """
    conditions = list(previous.get("conditions") or [])
    kept = [c for c in conditions if c.get("type") in ("Ready", "Progressing")]
    if not kept:
        kw = {"generation": generation, "previous": conditions}
        kept = [_condition("Ready", False, reason, message, **kw),
                _condition("Progressing", False, reason, message, **kw)]
    bad = _condition("Degraded", True, reason, message, generation=generation,
                     previous=conditions)
    return {"conditions": [*kept, bad], "observedGeneration": generation}
