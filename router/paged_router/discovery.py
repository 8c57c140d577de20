"""Backends from Kubernetes: the EndpointSlices of the engine Service.

A thread lists the slices labelled `kubernetes.io/service-name=SERVICE`, then watches them
(official `kubernetes` client, `watch.Watch`). After every event the whole backend set is
recomputed from every slice known (level-triggered), so a missed event costs nothing once
the next arrives; a failed or ended watch starts over with a fresh list. An endpoint is a
backend while its `conditions.ready` is not false (the API's reading of an unset value).

KV events (the precise policy): a slice whose ports include `kv-events` (ZeroMQ PUB) and
optionally `kv-replay` gives each of its endpoints' event endpoints, `tcp://ADDRESS:PORT`
(the operator names the engine Service's ports so, paged_operator/kv_events.py).
`EndpointSliceWatcher.kv_events_endpoints` maps each backend URL to (PUB, REPLAY or None),
updated in place on the event loop before the pool hears of the URL, so a follower that
reads it when a backend joins finds its endpoints there (a backend without them is absent:
ask the engine's GET /kv_events instead).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

from paged_router.pool import BackendPool

logger = logging.getLogger("paged_router")
SERVICE_LABEL = "kubernetes.io/service-name"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
KV_EVENTS_PORT_NAME, KV_REPLAY_PORT_NAME = "kv-events", "kv-replay"

Endpoints = tuple[str, "str | None"]  # (PUB, REPLAY or None), ZeroMQ addresses


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def slice_backends(eps: Any, service: str, port_name: str | None,
                   ) -> dict[str, Endpoints | None]:
    """Ready endpoints of one V1EndpointSlice: backend URL -> its KV-event endpoints from
    the slice's `kv-events` / `kv-replay` ports (None when the slice has no `kv-events`)."""
    if (eps.metadata.labels or {}).get(SERVICE_LABEL) != service:
        return {}
    # without a name, the first port that is not an event port (a slice lists its ports
    # in no promised order, and an engine's may carry kv-events / kv-replay beside http)
    ports = [p for p in eps.ports or [] if p.port and (
        p.name == port_name if port_name is not None
        else p.name not in (KV_EVENTS_PORT_NAME, KV_REPLAY_PORT_NAME))]
    if not ports:
        return {}
    port = ports[0].port
    named = {p.name: p.port for p in eps.ports or [] if p.port and p.name}
    pub, replay = named.get(KV_EVENTS_PORT_NAME), named.get(KV_REPLAY_PORT_NAME)
    found: dict[str, Endpoints | None] = {}
    for endpoint in eps.endpoints or []:
        ready = endpoint.conditions.ready if endpoint.conditions is not None else None
        if ready is False or not endpoint.addresses:
            continue
        host = _host(endpoint.addresses[0])
        found[f"http://{host}:{port}"] = None if pub is None else (
            f"tcp://{host}:{pub}", f"tcp://{host}:{replay}" if replay else None)
    return found


def slice_urls(eps: Any, service: str, port_name: str | None) -> set[str]:
    """Ready endpoint URLs of one V1EndpointSlice."""
    return set(slice_backends(eps, service, port_name))


class EndpointSliceWatcher:
    def __init__(self, service: str, pool: BackendPool, *, namespace: str | None = None,
                 port_name: str | None = None, retry_seconds: float = 1.0,
                 kv_events_endpoints: dict[str, Endpoints] | None = None) -> None:
        """`kv_events_endpoints`: the dict to keep up to date with each backend's event
        endpoints (e.g. a KVEventFollower's static endpoints); a new one by default."""
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            # $KUBECONFIG read now: the client reads it once, when kubernetes.config imports
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        self.api = client.DiscoveryV1Api()
        if namespace is None:  # the pod's own: the downward API's env, else the SA file
            namespace = os.environ.get("POD_NAMESPACE") or (
                NAMESPACE_FILE.read_text().strip() if NAMESPACE_FILE.exists() else "default")
        self.service, self.namespace, self.port_name = service, namespace, port_name
        self.pool, self.retry_seconds = pool, retry_seconds
        self.slices: dict[str, dict[str, Endpoints | None]] = {}
        self.kv_events_endpoints = {} if kv_events_endpoints is None else kv_events_endpoints
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.synced = threading.Event()  # set after the first list

    def _publish(self) -> None:
        backends: dict[str, Endpoints | None] = {}
        for found in self.slices.values():
            backends.update(found)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._apply, backends)

    def _apply(self, backends: dict[str, Endpoints | None]) -> None:
        """On the event loop: event endpoints first, then membership."""
        events = self.kv_events_endpoints
        for url in [u for u in events if backends.get(u) is None]:
            del events[url]
        events.update({url: ends for url, ends in backends.items() if ends is not None})
        self.pool.set_urls(sorted(backends))

    def _run(self) -> None:
        from kubernetes import watch

        selector = f"{SERVICE_LABEL}={self.service}"
        while not self._stop.is_set():
            try:
                listing = self.api.list_namespaced_endpoint_slice(
                    self.namespace, label_selector=selector)
                self.slices = {s.metadata.name: slice_backends(s, self.service,
                                                               self.port_name)
                               for s in listing.items}
                self._publish()
                self.synced.set()
                self._watch = watch.Watch()
                for event in self._watch.stream(
                        self.api.list_namespaced_endpoint_slice, self.namespace,
                        label_selector=selector,
                        resource_version=listing.metadata.resource_version):
                    if self._stop.is_set():
                        return
                    obj = event["object"]
                    if event["type"] == "DELETED":
                        self.slices.pop(obj.metadata.name, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self.slices[obj.metadata.name] = slice_backends(
                            obj, self.service, self.port_name)
                    else:
                        continue
                    self._publish()
            except Exception as exc:  # the API server went away, 410 Gone, ...: relist
                if self._stop.is_set():
                    return
                logger.warning("EndpointSlice watch for %s/%s failed (%s); relisting",
                               self.namespace, self.service, exc)
            self._stop.wait(self.retry_seconds)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch",
                                        daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)
