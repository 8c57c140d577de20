"""kopf handlers: one reconcile for create/update/resume, a drift timer, status from events.

- create/update/resume of a PagedInferenceService -> `reconcile` (children + status).
- a timer per resource re-runs the reconcile every $PAGED_OPERATOR_RESYNC_SECONDS
  (`RESYNC_SECONDS`, read at import: a kopf.timer's interval is fixed when it is
  declared): children edited or deleted by hand are put back.
- events of the Deployments we manage -> the owner's status follows the pods' readiness;
  a deleted Deployment is recreated at once.
- events of the engine pods -> an engine that cannot start (its container exits, or waits
  in CrashLoopBackOff / ImagePullBackOff) turns the owner Degraded with the engine's own
  last error, long before the Deployment's progress deadline.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import kopf

from . import manifests, status
from .kube import KINDS, ApiError, Kind, KubeApi, connection_info, load_configuration
from .reconcile import ChildError, Discovery, contains, reconcile_children
from paged_api.contract import GROUP, VERSION
from paged_api.contract import SERVICE_KIND as KIND
from paged_api.contract import SERVICE_PLURAL as PLURAL
from paged_api.service import DEFAULT_IMAGE, InvalidSpecError, parse_spec

PIS = Kind(f"{GROUP}/{VERSION}", PLURAL)
MANAGED = {"app.kubernetes.io/managed-by": manifests.MANAGED_BY}


def _seconds_from_env(var: str, default: float) -> float:
    raw = os.environ.get(var)
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{var} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{var} must be > 0, got {raw!r}")
    return value


# The drift check period per resource: the interval of the `resync` timer below.
RESYNC_SECONDS = _seconds_from_env("PAGED_OPERATOR_RESYNC_SECONDS", 60.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    discovery_ttl_seconds: float = 300.0  # how long "is KEDA / PodMonitor installed" is kept
    engine_image: str = DEFAULT_IMAGE     # for resources that do not set spec.image

    @classmethod
    def from_env(cls) -> "OperatorConfig":
        return cls(discovery_ttl_seconds=_seconds_from_env(
                       "PAGED_OPERATOR_DISCOVERY_TTL_SECONDS", cls.discovery_ttl_seconds),
                   engine_image=os.environ.get("PAGED_OPERATOR_ENGINE_IMAGE") or DEFAULT_IMAGE)


def _shared(memo: Any) -> tuple[KubeApi, Discovery, OperatorConfig]:
    # Set once on the operator-wide memo; per-object memos are shallow copies of it.
    if "kube" not in memo:
        config = OperatorConfig.from_env()
        memo["config"] = config
        memo["kube"] = KubeApi()
        memo["discovery"] = Discovery(ttl_seconds=config.discovery_ttl_seconds)
        memo["locks"] = {}
    return memo["kube"], memo["discovery"], memo["config"]


def _lock(memo: Any, namespace: str, name: str) -> asyncio.Lock:
    """One lock per resource, shared by its handlers, its timer and the events of its
    Deployment and pods: status is computed and written by one of them at a time, from
    fresh reads, so an older view never overwrites a newer one."""
    _shared(memo)
    return memo["locks"].setdefault((namespace, name), asyncio.Lock())


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    _shared(memo)
    # Our own annotation prefix instead of kopf's defaults; no status.kopf clutter.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.scanning.disabled = True        # no CRD/namespace watching: less RBAC
    # After its own PATCH (the handled-configuration annotation) kopf waits this long for
    # the patched version in the watch before it acts on an event again; past it, an
    # event older than that PATCH (the create handler's own status write) looks unhandled
    # and the create handler runs a second time. Its default, 5 s, is shorter than the
    # watch's lag when 1,000 resources arrive at once on 2 cores (883 of 1,000 ran twice).
    settings.persistence.consistency_timeout = 30.0
    settings.posting.level = logging.WARNING  # k8s Events only for problems
    # A resource deleted while its resync timer runs keeps its finalizer until kopf sees
    # the run end: look every second, not every 60 s (kopf's default).
    settings.background.cancellation_polling = 1.0
    # Watch only our Deployments and engine pods, filtered by the API server, not every
    # pod of the namespace (or cluster); the handlers' label filters stay as a second check.
    selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
    settings.watching.label_selectors["apps", "v1", "deployments"] = selector
    settings.watching.label_selectors["", "v1", "pods"] = \
        f"{selector},app.kubernetes.io/component=engine"
    # Several replicas (the chart's replicaCount > 1) peer through kopf: the longest-running
    # one handles resources (an earlier start is a higher priority; equal ones would all
    # pause), the others wait until its record is removed (exit) or expires (crash).
    if peering := os.environ.get("PAGED_OPERATOR_PEERING"):
        settings.peering.name, settings.peering.mandatory = peering, True
        settings.peering.standalone = False
        settings.peering.priority = -(time.time_ns() // 1000)
        settings.peering.lifetime = int(os.environ.get("PAGED_OPERATOR_PEERING_LIFETIME", 10))


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """The official client's own loaders (in-cluster, else kubeconfig); kopf's watches get
    the same credentials."""
    cfg = await asyncio.to_thread(load_configuration)
    api, _, _ = _shared(memo)
    await api.connect(cfg)
    return connection_info(cfg, trust_env=settings.networking.trust_env)


@kopf.on.cleanup()
async def close_client(memo: Any, **_: Any) -> None:
    api, _, _ = _shared(memo)
    await api.close(final=True)


@kopf.on.probe(id="api")
def api_probe(memo: Any, **_: Any) -> str:
    return "connected" if "kube" in memo else "starting"


async def _write_status(api: KubeApi, body: Mapping[str, Any], new: dict[str, Any]) -> None:
    if contains(body.get("status") or {}, new):
        return  # unchanged: repeating a reconcile writes nothing
    meta = body["metadata"]
    await api.patch(PIS, meta["namespace"], meta["name"], {"status": new}, subresource="status")


async def reconcile_object(body: Mapping[str, Any], memo: Any, logger: Any, *,
                           first_try: bool = False, periodic: bool = False) -> None:
    """One reconcile. An API call that fails outside the children loop (discovery, the
    status write, reading pods: a 5xx, a timeout) is a TemporaryError too, as inside it:
    the handler (or the resync timer) retries soon, not after kopf's 60 s backoff for an
    unknown error. `first_try`: kopf's first try of the create handler; `periodic`: the
    resync timer's pass (reconcile.py's docstring says what each leaves out)."""
    try:
        await _reconcile_object(body, memo, logger, first_try=first_try, periodic=periodic)
    except ApiError as exc:
        raise kopf.TemporaryError(str(exc), delay=10) from exc


async def _reconcile_object(body: Mapping[str, Any], memo: Any, logger: Any, *,
                            first_try: bool, periodic: bool) -> None:
    api, discovery, config = _shared(memo)
    meta = body["metadata"]
    generation = meta.get("generation")
    previous = body.get("status") or {}
    # Never reconciled (no status, kopf's first try) and the spec as created (generation 1:
    # an attempt killed before this one wanted the same children): write first, read on
    # conflict, skip unwanted children (reconcile.py's docstring).
    fresh = first_try and not previous.get("conditions") and generation == 1
    # Handlers and the timer of one object never reconcile at the same time.
    async with _lock(memo, meta["namespace"], meta["name"]):
        try:
            spec = parse_spec(body.get("spec") or {}, name=meta["name"],
                              namespace=meta["namespace"], default_image=config.engine_image)
        except InvalidSpecError as exc:
            await _write_status(api, body, status.degraded(
                str(exc), reason="InvalidSpec", generation=generation, previous=previous))
            raise kopf.PermanentError(f"invalid spec: {exc}") from exc
        try:
            live = await reconcile_children(api, discovery, spec, owner=body, logger=logger,
                                            fresh=fresh, periodic=periodic)
        except ChildError as exc:
            await _write_status(api, body, status.degraded(
                str(exc), reason="ChildRejected", generation=generation, previous=previous))
            raise kopf.TemporaryError(str(exc), delay=60) from exc
        deployment = live.get(("Deployment", spec.name)) or {}
        router = live.get(("Deployment", f"{spec.name}-router"))
        # A Deployment without any status (as this pass's POST answers it) has not been
        # seen by its controller yet: no ReplicaSet, so no pods to list.
        pods = await engine_pods(api, spec.namespace, spec.name) \
            if deployment.get("status") else []
        await _write_status(api, body, status.from_deployment(
            spec, deployment, generation=generation, previous=previous, pods=pods,
            router=router if spec.router.enabled else None))


async def engine_pods(api: KubeApi, namespace: str, name: str) -> list[dict[str, Any]]:
    return await api.list(KINDS["Pod"], namespace,
                          labels={**manifests.selector_labels(name), **MANAGED})


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile(body: kopf.Body, memo: Any, logger: kopf.Logger, reason: str,
                    retry: int, **_: Any) -> None:
    await reconcile_object(body, memo, logger,
                           first_try=reason == kopf.Reason.CREATE and retry == 0)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync(body: kopf.Body, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    """The reconcile again, one interval after the previous run ended (the first one
    interval after the resource is seen: create/resume have just reconciled it). kopf
    stops the timer when the resource is being deleted, letting a run in progress finish.
    A run that fails is only reported: the next interval is the retry (kopf would wait for
    the error's own delay instead, 10-60 s, however short the interval)."""
    api, _, _ = _shared(memo)
    if api.closed or body.get("metadata", {}).get("deletionTimestamp"):
        return  # the operator is exiting, or the resource going away
    try:
        await reconcile_object(body, memo, logger, periodic=True)  # body: kopf's live view
    except (kopf.PermanentError, kopf.TemporaryError) as exc:
        logger.warning(f"Resync did not complete: {exc}")


def _owner(body: Mapping[str, Any]) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
            return ref.get("name")
    return None


async def _status_from_event(owner_name: str, namespace: str, memo: Any,
                             seen: Mapping[str, Any] | None = None) -> None:
    """Recompute the owner's status from fresh reads of its engine Deployment and pods
    (the event only says that something changed; no child is written here). `seen`: the
    Deployment whose watch event this is, as the watch has it now (not read again)."""
    api, _, config = _shared(memo)

    async def deployment_named(name: str) -> dict[str, Any] | None:
        if seen is not None and seen["metadata"]["name"] == name:
            return dict(seen)
        return await api.get(KINDS["Deployment"], namespace, name)
    async with _lock(memo, namespace, owner_name):
        owner = await api.get(PIS, namespace, owner_name)
        if owner is None or owner["metadata"].get("deletionTimestamp"):
            return  # the owner is going away: garbage collection handles the rest
        try:
            spec = parse_spec(owner.get("spec") or {}, name=owner_name, namespace=namespace,
                              default_image=config.engine_image)
        except InvalidSpecError:
            return  # the owner's own reconcile reports this
        deployment = await deployment_named(owner_name)
        if deployment is None:
            return  # the reconcile (re)creates it
        pods = await engine_pods(api, namespace, owner_name)
        router = await deployment_named(f"{owner_name}-router") if spec.router.enabled \
            else None
        await _write_status(api, owner, status.from_deployment(
            spec, deployment, generation=reflected_generation(owner, spec, deployment),
            previous=owner.get("status") or {}, pods=pods, router=router))


def reflected_generation(owner: Mapping[str, Any], spec: Any,
                         deployment: Mapping[str, Any]) -> int | None:
    """The owner's generation that a status computed from `deployment` may claim: the
    current one when the Deployment holds what that spec asks for (manifests.deployment,
    compared as apply_child compares), else the one the status last observed. An event
    can carry a Deployment older than the owner's spec: a watch event queued before the
    reconcile applied the new template, or a pod event read before that reconcile ran.
    Its rollout is complete, but for the old template; claiming the new generation with
    it would tell a client waiting for the new generation's rollout (the tuner applying
    a setting, `kubectl wait`) that the new pods serve while the old ones still do."""
    current = owner["metadata"].get("generation")
    if contains(deployment, manifests.deployment(spec)):
        return current
    return (owner.get("status") or {}).get("observedGeneration")


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def deployment_event(type: str | None, body: kopf.Body, memo: Any,
                           logger: kopf.Logger, **_: Any) -> None:
    owner_name = _owner(body)
    if owner_name is None:
        return
    namespace = body["metadata"]["namespace"]
    if body["metadata"]["name"] == f"{owner_name}-router":
        if type != "DELETED":  # the router's readiness is part of the owner's Ready
            await _status_from_event(owner_name, namespace, memo, seen=body)
        return
    if body["metadata"]["name"] != owner_name:
        return
    if type == "DELETED":
        api, _, _ = _shared(memo)
        owner = await api.get(PIS, namespace, owner_name)
        if owner is not None and not owner["metadata"].get("deletionTimestamp"):
            await reconcile_object(owner, memo, logger)  # deleted by hand: put it back now
        return
    await _status_from_event(owner_name, namespace, memo, seen=body)


@kopf.on.event("", "v1", "pods", labels={**MANAGED, "app.kubernetes.io/component": "engine"})
async def engine_pod_event(body: kopf.Body, memo: Any, **_: Any) -> None:
    """Pods are owned by ReplicaSets: the owner is named by the instance label."""
    owner_name = (body.get("metadata", {}).get("labels") or {}).get(
        "app.kubernetes.io/instance")
    if owner_name:
        await _status_from_event(owner_name, body["metadata"]["namespace"], memo)
