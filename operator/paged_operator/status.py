"""The status of a PagedInferenceService, derived from its Deployment's real state.

The operator's conditions are Ready, Progressing and Degraded (paged_api/conditions.py for
their form); a condition of another type (the SLO planner's Planning) is kept as found.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import manifests
from paged_api.conditions import OPERATOR_TYPES, others
from paged_api.conditions import condition as _condition
from paged_api.service import ServiceSpec


def _deployment_failure(deployment: Mapping[str, Any]) -> str | None:
    for cond in deployment.get("status", {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return cond.get("message") or "replica failure"
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return cond.get("message") or "the rollout exceeded its progress deadline"
    return None


# Waiting reasons that will not resolve by waiting (the kubelet's and the image puller's).
STUCK_WAITING = frozenset({"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff",
                           "InvalidImageName", "CreateContainerConfigError",
                           "CreateContainerError", "RunContainerError"})
MESSAGE_LIMIT = 1024  # a condition message, not a log: the tail of the engine's last words


def _tail(text: str) -> str:
    text = " ".join(text.strip().split())
    return text if len(text) <= MESSAGE_LIMIT else "..." + text[-MESSAGE_LIMIT:]


def _terminated(term: Mapping[str, Any]) -> str:
    out = f"exited with code {term.get('exitCode')}"
    if term.get("reason"):
        out += f" ({term['reason']})"
    if term.get("message"):
        out += f": {_tail(str(term['message']))}"
    return out


def pod_failure(pods: Sequence[Mapping[str, Any]], container: str = "engine") -> str | None:
    """Why the engine cannot start, from its pods: the container's own last error
    (lastState/state.terminated: exit code, reason and, with FallbackToLogsOnError, its last
    log lines) or a waiting reason that will not resolve, or an unschedulable pod. None
    while every pod is fine or still starting normally."""
    for pod in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", "")):
        name = pod.get("metadata", {}).get("name", "?")
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue  # going away in a rollout: its state is history
        pstatus = pod.get("status") or {}
        for cond in pstatus.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                    and cond.get("reason") == "Unschedulable":
                return f"pod {name} cannot be scheduled: {cond.get('message', '')}".strip()
        for cs in pstatus.get("containerStatuses") or []:
            if cs.get("name") != container or cs.get("ready"):
                continue
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            waiting = state.get("waiting") or {}
            terminated = state.get("terminated") or last.get("terminated")
            if terminated and terminated.get("exitCode") not in (0, None):
                restarts = cs.get("restartCount") or 0
                suffix = f"; {waiting['reason']}" if waiting.get("reason") else ""
                return (f"pod {name}: {container} {_terminated(terminated)}"
                        f" (restarts: {restarts}{suffix})")
            if waiting.get("reason") in STUCK_WAITING:
                detail = f": {_tail(str(waiting['message']))}" if waiting.get("message") else ""
                return f"pod {name}: {container} {waiting['reason']}{detail}"
    return None


def from_deployment(spec: ServiceSpec, deployment: Mapping[str, Any], *,
                    generation: int | None, previous: Mapping[str, Any],
                    pods: Sequence[Mapping[str, Any]] = (),
                    router: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Status for a valid spec whose children were applied; `pods` are the engine's,
    `router` the router Deployment when spec.router is enabled (the Service then sends
    every request through it, so the resource is not Ready before one router pod is)."""
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
    engine_failure = pod_failure(pods)
    failure = engine_failure or _deployment_failure(deployment)
    counts = f"{ready}/{desired} replicas ready, {updated}/{desired} updated"

    if desired == 0:
        ready_cond = (False, "ScaledToZero", "spec.replicas is 0")
    elif ready >= desired and caught_up and spec.router.enabled \
            and int((router or {}).get("status", {}).get("readyReplicas") or 0) < 1:
        ready_cond = (False, "RouterNotReady", f"{counts}; no router pod ready yet (the "
                      "Service sends requests through the router)")
    elif ready >= desired and caught_up:
        ready_cond = (True, "AllReplicasReady", counts)
    else:
        ready_cond = (False, "ReplicasNotReady", counts)
    progressing = (not rolled_out, "RollingOut" if not rolled_out else "RolloutComplete", counts)
    reason = "EngineFailing" if engine_failure else "DeploymentFailing" if failure \
        else "AsExpected"
    degraded = (failure is not None, reason, failure or "no failures reported")
    kw = {"generation": generation, "previous": conditions}
    return {
        "conditions": [_condition("Ready", *ready_cond, **kw),
                       _condition("Progressing", *progressing, **kw),
                       _condition("Degraded", *degraded, **kw),
                       *others(conditions, OPERATOR_TYPES)],
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
    return {"conditions": [*kept, bad, *others(conditions, OPERATOR_TYPES)],
            "observedGeneration": generation}
