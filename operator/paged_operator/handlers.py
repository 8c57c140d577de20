"""kopf handlers: one reconcile for create/update/resume, a drift daemon, status from events.

- create/update/resume of a PagedInferenceService -> `reconcile` (children + status).
- a daemon per resource re-runs the reconcile every `resync_seconds`: children edited or
  deleted by hand are put back.
- events of the Deployments we manage -> the owner's status follows the pods' readiness;
  a deleted Deployment is recreated at once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from . import manifests, status
from .kube import Kind, KubeApi
from .reconcile import ChildError, Discovery, contains, reconcile_children
from .spec import DEFAULT_IMAGE, GROUP, KIND, PLURAL, VERSION, InvalidSpecError, parse_spec

PIS = Kind(f"{GROUP}/{VERSION}", PLURAL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    resync_seconds: float = 60.0      # drift check period per resource
    discovery_ttl_seconds: float = 300.0  # how long "is KEDA / PodMonitor installed" is kept
    engine_image: str = DEFAULT_IMAGE     # for resources that do not set spec.image

    @classmethod
    def from_env(cls) -> "OperatorConfig":
        def number(var: str, default: float) -> float:
            raw = os.environ.get(var)
            try:
                value = float(raw) if raw else default
            except ValueError:
                raise ValueError(f"{var} must be a number of seconds, got {raw!r}") from None
            if value <= 0:
                raise ValueError(f"{var} must be > 0, got {raw!r}")
            return value
        return cls(resync_seconds=number("PAGED_OPERATOR_RESYNC_SECONDS", cls.resync_seconds),
                   discovery_ttl_seconds=number("PAGED_OPERATOR_DISCOVERY_TTL_SECONDS",
                                                cls.discovery_ttl_seconds),
                   engine_image=os.environ.get("PAGED_OPERATOR_ENGINE_IMAGE") or DEFAULT_IMAGE)


def _shared(memo: Any) -> tuple[KubeApi, Discovery, OperatorConfig]:
    # Set once on the operator-wide memo; per-object memos are shallow copies of it.
    if "kube" not in memo:
        config = OperatorConfig.from_env()
        memo["config"] = config
        memo["kube"] = KubeApi()
        memo["discovery"] = Discovery(ttl_seconds=config.discovery_ttl_seconds)
    return memo["kube"], memo["discovery"], memo["config"]


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    _shared(memo)
    # Our own annotation prefix instead of kopf's defaults; no status.kopf clutter.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.scanning.disabled = True        # no CRD/namespace watching: less RBAC
    settings.posting.level = logging.WARNING  # k8s Events only for problems


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, memo: Any, **kwargs: Any,
                ) -> kopf.ConnectionInfo:
    info = (kopf.login_with_service_account(settings=settings, **kwargs)
            or kopf.login_with_kubeconfig(settings=settings, **kwargs))
    if info is None:
        raise kopf.LoginError("No credentials: run in a pod with a service account, "
                              "or set KUBECONFIG")
    api, _, _ = _shared(memo)
    await api.connect(info)  # our client for the children uses the same credentials
    return info


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


async def reconcile_object(body: Mapping[str, Any], memo: Any, logger: Any) -> None:
    api, discovery, config = _shared(memo)
    meta = body["metadata"]
    generation = meta.get("generation")
    previous = body.get("status") or {}
    # Handlers and the daemon of one object never reconcile at the same time.
    lock = memo.setdefault("reconcile_lock", asyncio.Lock())
    async with lock:
        try:
            spec = parse_spec(body.get("spec") or {}, name=meta["name"],
                              namespace=meta["namespace"], default_image=config.engine_image)
        except InvalidSpecError as exc:
            await _write_status(api, body, status.degraded(
                str(exc), reason="InvalidSpec", generation=generation, previous=previous))
            raise kopf.PermanentError(f"invalid spec: {exc}") from exc
        try:
            deployment = await reconcile_children(api, discovery, spec, owner=body,
                                                  logger=logger)
        except ChildError as exc:
            await _write_status(api, body, status.degraded(
                str(exc), reason="ChildRejected", generation=generation, previous=previous))
            raise kopf.TemporaryError(str(exc), delay=60) from exc
        await _write_status(api, body, status.from_deployment(
            spec, deployment, generation=generation, previous=previous))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile(body: kopf.Body, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    await reconcile_object(body, memo, logger)


async def _pause(stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Sleep until `seconds` pass or the daemon is stopped.

    asyncio.wait() rather than wait_for(): on Python 3.11 wait_for() can turn a
    cancellation that coincides with its timeout into a TimeoutError.
    """
    flag = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait([flag], timeout=seconds)
    finally:
        flag.cancel()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5)
async def resync(stopped: kopf.DaemonStopped, body: kopf.Body, memo: Any,
                 logger: kopf.Logger, **_: Any) -> None:
    api, _, config = _shared(memo)
    while not stopped:
        await _pause(stopped, config.resync_seconds)
        if stopped or api.closed or body.get("metadata", {}).get("deletionTimestamp"):
            return
        try:
            await reconcile_object(body, memo, logger)  # body is kopf's live view
        except (kopf.PermanentError, kopf.TemporaryError) as exc:
            logger.warning(f"Resync did not complete: {exc}")


def _owner(body: Mapping[str, Any]) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
            return ref.get("name")
    return None


@kopf.on.event("apps", "v1", "deployments",
               labels={"app.kubernetes.io/managed-by": manifests.MANAGED_BY})
async def deployment_event(type: str | None, body: kopf.Body, memo: Any,
                           logger: kopf.Logger, **_: Any) -> None:
    api, _, config = _shared(memo)
    owner_name = _owner(body)
    if owner_name is None:
        return
    namespace = body["metadata"]["namespace"]
    owner = await api.get(PIS, namespace, owner_name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return  # the owner is going away: garbage collection handles the rest
    if type == "DELETED":
        await reconcile_object(owner, memo, logger)  # deleted by hand: put it back now
        return
    try:
        spec = parse_spec(owner.get("spec") or {}, name=owner_name, namespace=namespace,
                          default_image=config.engine_image)
    except InvalidSpecError:
        return  # the owner's own reconcile reports this
    await _write_status(api, owner, status.from_deployment(
        spec, body, generation=owner["metadata"].get("generation"),
        previous=owner.get("status") or {}))
