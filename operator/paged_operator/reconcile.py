"""Make a PagedInferenceService's children match its spec, idempotently.

One pass: parse the spec (nothing is written if that fails), build every desired child,
then for each child GET it and POST it when missing or merge-PATCH it when it differs from
what we want (compared as a subset, so fields the API server defaults never count as
drift). Optional children that are no longer wanted (HPA after autoscaling is removed...)
are deleted when they are ours. Running a pass twice changes nothing the second time.

A resource's first pass (`fresh`: kopf's first try of its create handler, before any status,
at generation 1) writes first and reads only on a conflict: POST each child, and on 409 GET
it and go on as above. It skips the unwanted children too: an object owned by this
resource's uid can only come from a pass of this resource, and any earlier one (a killed
operator's attempt) saw this same spec, generation 1, so wanted what this one wants. That
halves the requests of the common case, 1,000 services created at once
(docs/benchmarks/operator.md); later passes read first, since their children exist.

The periodic pass (`periodic`: the resync timer) reads every wanted child, to put back what
was edited or deleted by hand, but looks for unwanted ones only where the cluster decides
(an HPA once KEDA is installed, a ScaledObject once it is gone): the others follow the spec
alone, and a spec change runs the update handler's full pass (resume runs one too).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import kopf

from . import kv_events, manifests, manifests_access, manifests_planner
from .kube import KINDS, ApiError, KubeApi
from paged_api.service import ServiceSpec, quantity_value


class ChildError(Exception):
    """A child cannot be written: its name is taken by an object this resource does not
    own, or the API server refuses it (400/403/422). Retrying will not help."""


def _scalar_equal(want: Any, have: Any) -> bool:
    if want == have:
        return True
    if isinstance(want, (int, float)) and not isinstance(want, bool) or \
            isinstance(have, (int, float)) and not isinstance(have, bool):
        return False  # numbers are compared as they are; only strings may be quantities
    # The API server canonicalises quantities ("1000m" comes back as "1").
    a, b = quantity_value(want), quantity_value(have)
    return a is not None and a == b


def contains(have: Any, want: Any) -> bool:
    """Whether `have` (the live object) holds everything in `want` (the desired one)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            k in have and contains(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(
            contains(h, w) for h, w in zip(have, want))
    return _scalar_equal(want, have)


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


class Discovery:
    """Remembers for a while which optional APIs (PodMonitor, KEDA) the cluster serves."""

    def __init__(self, *, ttl_seconds: float) -> None:
        self.ttl = ttl_seconds
        self._seen: dict[str, tuple[float, asyncio.Future[bool | Exception]]] = {}

    async def has(self, api: KubeApi, kind_name: str) -> bool:
        """One request per kind and period, however many reconciles ask at once."""
        now = time.monotonic()
        cached = self._seen.get(kind_name)
        failed = cached is not None and cached[1].done() and (
            cached[1].cancelled() or isinstance(cached[1].result(), Exception))
        if cached is None or now - cached[0] > self.ttl or failed:
            cached = (now, asyncio.ensure_future(_probe(api, KINDS[kind_name])))
            self._seen[kind_name] = cached
        answer = await asyncio.shield(cached[1])
        if isinstance(answer, Exception):
            raise answer
        return answer


async def _probe(api: KubeApi, kind: Any) -> bool | Exception:
    """The shared request's task returns its error instead of raising it: kopf re-raises,
    at shutdown, the error of every task it did not start, and a discovery cut short by
    the shutdown ("the operator is shutting down") would fail the whole operator."""
    try:
        return await api.has_resource(kind)
    except Exception as exc:  # noqa: BLE001 - handed to every waiter by has()
        return exc


# Creation order: what pods mount or run as must exist before the Deployments that use it.
ORDER = ["PersistentVolumeClaim", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
         "NetworkPolicy", "Service", "Deployment"]


def optional_names(spec: ServiceSpec) -> dict[tuple[str, str], dict[str, Any] | None]:
    """{(kind, name): child or None} for children that exist only with some settings;
    None means it must not exist (deleted if it is ours)."""
    router = spec.router.enabled
    optional: dict[tuple[str, str], dict[str, Any] | None] = {
        ("PersistentVolumeClaim", f"{spec.name}-model-cache"): manifests.model_cache_claim(spec),
        ("NetworkPolicy", spec.name): manifests_access.network_policy(spec),
        ("NetworkPolicy", kv_events.policy_name(spec)):
            manifests_access.kv_events_network_policy(spec)}
    for key, child in zip(
            [("ServiceAccount", manifests_access.router_name(spec)),
             ("Role", manifests_access.router_name(spec)),
             ("RoleBinding", manifests_access.router_name(spec)),
             ("Service", manifests_access.engine_service_name(spec)),
             ("Deployment", manifests_access.router_name(spec))],
            manifests_access.router_children(spec) if router else [None] * 5):
        optional[key] = child
    planner = manifests_planner.planner_name(spec)
    for kind, child in zip(("ServiceAccount", "Role", "RoleBinding", "Deployment"),
                           manifests_planner.planner_children(spec) or [None] * 4):
        optional[(kind, planner)] = child
    return optional


async def desired_children(api: KubeApi, discovery: Discovery, spec: ServiceSpec,
                           ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(children to apply, (kind, name) of optional children that must not exist)."""
    wanted = [manifests.config_map(spec), manifests.service(spec),
              manifests.deployment(spec), manifests.pod_disruption_budget(spec)]
    optional = optional_names(spec)
    keda = await discovery.has(api, "ScaledObject")
    autoscaled = spec.autoscaling is not None
    optional[("ScaledObject", spec.name)] = manifests.scaled_object(spec) if keda else None
    # KEDA makes its own HPA: ours only without KEDA.
    optional[("HorizontalPodAutoscaler", spec.name)] = \
        manifests.horizontal_pod_autoscaler(spec) if autoscaled and not keda else None
    if not keda:
        del optional[("ScaledObject", spec.name)]  # its API is not served: nothing to delete
    if await discovery.has(api, "PodMonitor"):
        optional[("PodMonitor", spec.name)] = manifests.pod_monitor(spec)
        optional[("PodMonitor", manifests_planner.planner_name(spec))] = \
            manifests_planner.planner_pod_monitor(spec)
    unwanted = [key for key, child in optional.items() if child is None]
    wanted += [child for child in optional.values() if child is not None]
    wanted.sort(key=lambda c: ORDER.index(c["kind"]) if c["kind"] in ORDER else len(ORDER))
    return wanted, unwanted


async def apply_child(api: KubeApi, child: dict[str, Any], *, owner_uid: str,
                      logger: Any, create_first: bool = False) -> dict[str, Any]:
    """The live child once it matches; `create_first`: POST before any GET (409: read)."""
    kind = KINDS[child["kind"]]
    ns, name = child["metadata"]["namespace"], child["metadata"]["name"]
    actual = None if create_first else await api.get(kind, ns, name)
    if actual is None:
        created = await api.create(kind, ns, child)
        if created is not None:
            logger.info(f"Created {child['kind']} {name}")
            return created
        actual = await api.get(kind, ns, name)  # it exists: ours from before, or not ours
        if actual is None:
            raise kopf.TemporaryError(f"{child['kind']} {name} vanished while creating", delay=1)
    if not owned_by(actual, owner_uid):
        raise ChildError(f"{child['kind']} {ns}/{name} exists and is not owned by this "
                                 "PagedInferenceService: delete it or rename the resource")
    if contains(actual, child):
        return actual
    logger.info(f"Updating {child['kind']} {name} back to the desired state")
    patched = await api.patch(kind, ns, name, child)
    return patched if patched is not None else await apply_child(
        api, child, owner_uid=owner_uid, logger=logger)


async def remove_unwanted(api: KubeApi, kind_name: str, name: str, spec: ServiceSpec, *,
                          owner_uid: str, logger: Any) -> None:
    obj = await api.get(KINDS[kind_name], spec.namespace, name)
    if obj is not None and owned_by(obj, owner_uid):  # never touch what a user made
        logger.info(f"Deleting {kind_name} {name}: no longer asked for")
        await api.delete(KINDS[kind_name], spec.namespace, name)


# Optional children whose wanting depends on the cluster's APIs, not on the spec alone.
CLUSTER_DEPENDENT = frozenset({"HorizontalPodAutoscaler", "ScaledObject"})


async def reconcile_children(api: KubeApi, discovery: Discovery, spec: ServiceSpec, *,
                             owner: Mapping[str, Any], logger: Any, fresh: bool = False,
                             periodic: bool = False,
                             ) -> dict[tuple[str, str], dict[str, Any]]:
    """Apply all children; returns the live ones by (kind, name) (status reads the
    Deployments). `fresh`: the resource's first pass; `periodic`: the resync timer's (see
    the module's docstring)."""
    uid = owner["metadata"]["uid"]
    wanted, unwanted = await desired_children(api, discovery, spec)
    if fresh:
        unwanted = []
    elif periodic:
        unwanted = [key for key in unwanted if key[0] in CLUSTER_DEPENDENT]
    kopf.adopt(wanted, owner=owner)  # owner references: deletion cascades to children
    live: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for child in wanted:
            live[child["kind"], child["metadata"]["name"]] = await apply_child(
                api, child, owner_uid=uid, logger=logger, create_first=fresh)
        for kind_name, name in unwanted:
            await remove_unwanted(api, kind_name, name, spec, owner_uid=uid, logger=logger)
    except ApiError as exc:
        if exc.status in (400, 403, 422):  # the request itself is refused: retrying won't help
            raise ChildError(exc.message) from exc
        raise kopf.TemporaryError(str(exc), delay=10) from exc
    return live
