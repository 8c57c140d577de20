"""kopf handlers for PagedInferenceTuning: the operator owns the tuner Job's life.

- create/update/resume: unless suspended or finished, make the Job's ServiceAccount, Role,
  RoleBinding and the Job (tuning_manifests), owned by the tuning resource; phase Pending
  until the Job writes its own. A spec no Job could run (spec.workload and
  spec.workloadFrom both, workloadFrom.prometheus without spec.prometheus.url, ...) makes
  no Job: phase Failed and the condition SpecValid False naming the field; fixing the spec
  makes the Job then.
- spec.suspend: delete the Job (its pod is stopped: the tuner deletes its trial service)
  and every trial service of the tuning; phase Suspended. Unsuspending makes a new Job,
  which resumes from status.history.
- a failed pod is replaced by the Job itself (backoffLimit); a Job that gave up turns the
  tuning Failed with the reason.
- deleting the tuning resource: Kubernetes' garbage collector deletes the Job, its pod and
  the trial services, all owned by it.
"""
from __future__ import annotations

import datetime
from typing import Any

import kopf

from . import tuning_manifests as tm
from .handlers import _shared
from .kube import KINDS, Kind, KubeApi
from paged_api.contract import (API_VERSION, GROUP, TUNING_KIND, TUNING_LABEL, TUNING_PLURAL, VERSION,
                       spec_error)
from paged_api.contract import SERVICE_PLURAL as PLURAL

TUNING = Kind(API_VERSION, TUNING_PLURAL)
PIS = Kind(API_VERSION, PLURAL)
JOB = Kind("batch/v1", "jobs", ("BatchV1Api", "job"))
CHILD_KINDS = {"ServiceAccount": KINDS["ServiceAccount"], "Role": KINDS["Role"],
               "RoleBinding": KINDS["RoleBinding"], "Job": JOB,
               "Service": KINDS["Service"], "Deployment": KINDS["Deployment"]}
TUNER_SELECTOR = {"app.kubernetes.io/managed-by": tm.MANAGED_BY,
                  "app.kubernetes.io/component": "tuner"}
FINAL = ("Succeeded", "Failed")


@kopf.on.startup()
async def watch_tuner_jobs(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.watching.label_selectors["batch", "v1", "jobs"] = ",".join(
        f"{k}={v}" for k, v in TUNER_SELECTOR.items())


def _owner(body: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": TUNING_KIND,
            "name": body["metadata"]["name"], "uid": body["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


async def _status(api: KubeApi, namespace: str, name: str, fields: dict[str, Any]) -> None:
    await api.patch(TUNING, namespace, name, {"status": fields}, subresource="status")


def _spec_valid(error: str | None) -> list[dict[str, Any]]:
    return [{"type": "SpecValid", "status": "False" if error else "True",
             "reason": "InvalidSpec" if error else "Valid", "message": error or "",
             "lastTransitionTime": _now()}]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refused(status: dict[str, Any]) -> bool:
    """Failed by the operator for its spec (not by a run): a fixed spec may start."""
    return any(c.get("type") == "SpecValid" and c.get("status") == "False"
               for c in status.get("conditions") or [])


async def _stop(api: KubeApi, namespace: str, name: str) -> None:
    """Delete the Job with its pod (Background: the pod is not orphaned), the load-worker
    pods and the trials."""
    batch = api._api("BatchV1Api")
    await api._call(batch.delete_namespaced_job, tm.tuner_name(name), namespace,
                    propagation_policy="Background")
    await _stop_load_workers(api, namespace, name)
    for trial in await api.list(PIS, namespace, labels={TUNING_LABEL: name}):
        await api.delete(PIS, namespace, trial["metadata"]["name"])


async def _stop_load_workers(api: KubeApi, namespace: str, name: str) -> None:
    """The load-worker Deployments (spec.loadWorkers > 1) and their Services, which share
    their names (the operator's Role lists Deployments, not Services)."""
    selector = {"app.kubernetes.io/instance": name,
                "app.kubernetes.io/component": "load-worker",
                "app.kubernetes.io/managed-by": tm.MANAGED_BY}
    for deployment in await api.list(KINDS["Deployment"], namespace, labels=selector):
        # the Service first: a failure in between leaves the Deployment to find next time
        await api.delete(KINDS["Service"], namespace, deployment["metadata"]["name"])
        await api.delete(KINDS["Deployment"], namespace, deployment["metadata"]["name"])


@kopf.on.resume(GROUP, VERSION, TUNING_PLURAL)
@kopf.on.create(GROUP, VERSION, TUNING_PLURAL)
@kopf.on.update(GROUP, VERSION, TUNING_PLURAL)
async def reconcile_tuning(body: kopf.Body, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    api, _, config = _shared(memo)
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, name = meta["namespace"], meta["name"]
    status = body.get("status") or {}
    phase = status.get("phase")
    if spec.get("suspend"):
        await _stop(api, namespace, name)
        if phase not in FINAL:
            await _status(api, namespace, name, {"phase": "Suspended"})
        return
    if phase in FINAL and not _refused(status):
        return  # the Job and its pod stay as the record of the run
    error = spec_error(spec)
    if error:
        await _status(api, namespace, name, {"phase": "Failed", "conditions": _spec_valid(error),
                                             "decision": {"reason": error}})
        raise kopf.PermanentError(error)
    if len(name) > 38:
        await _status(api, namespace, name, {"phase": "Failed", "decision": {
            "reason": "metadata.name must be at most 38 characters (trial services add "
                      "suffixes to it)"}})
        raise kopf.PermanentError("name too long")
    image = config.engine_image
    target_name = (spec.get("targetRef") or {}).get("name")
    target = await api.get(PIS, namespace, target_name) if target_name else None
    api_key = ((target or {}).get("spec") or {}).get("apiKeySecretRef") or None
    for child in tm.children(name, namespace, spec, image=image, api_key=api_key):
        child["metadata"]["ownerReferences"] = [_owner(body)]
        kind = CHILD_KINDS[child["kind"]]
        if await api.create(kind, namespace, child) is None:
            existing = await api.get(kind, namespace, child["metadata"]["name"])
            if existing is None or existing["metadata"].get("deletionTimestamp"):
                # the Job of a suspension is still going away: make the new one after it
                raise kopf.TemporaryError(f"{child['kind']} {child['metadata']['name']} "
                                          "is being deleted", delay=2)
    if phase in (None, "", "Suspended") or _refused(status):
        await _status(api, namespace, name, {"phase": "Pending", "job": tm.tuner_name(name),
                                             "conditions": _spec_valid(None), "decision": None})
    logger.info(f"tuner Job {tm.tuner_name(name)} in place")


@kopf.on.event("batch", "v1", "jobs", labels=TUNER_SELECTOR)
async def tuner_job_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    """A finished Job's load-worker pods go; a Job that gave up (backoffLimit exceeded)
    turns its tuning Failed."""
    if type == "DELETED":
        return
    conditions = [c for c in (body.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"]
    failed = next((c for c in conditions if c.get("type") == "Failed"), None)
    owner = next((r["name"] for r in body["metadata"].get("ownerReferences") or []
                  if r.get("kind") == TUNING_KIND), None)
    if owner is None:
        return
    api, _, _ = _shared(memo)
    namespace = body["metadata"]["namespace"]
    if failed is not None or any(c.get("type") == "Complete" for c in conditions):
        await _stop_load_workers(api, namespace, owner)
    if failed is None:
        return
    tuning = await api.get(TUNING, namespace, owner)
    if tuning is None or (tuning.get("status") or {}).get("phase") in FINAL:
        return
    await _status(api, namespace, owner, {"phase": "Failed", "decision": {
        "reason": f"the tuner Job failed {tm.BACKOFF_LIMIT + 1} times "
                  f"({failed.get('reason', 'Failed')}): kubectl logs job/{body['metadata']['name']}"}})
