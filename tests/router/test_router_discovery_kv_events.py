"""Discovery of the engines' KV-event endpoints from the EndpointSlices' named ports
(`kv-events`, `kv-replay`: the ports the operator gives the engines' headless Service with
spec.router.policy: precise), served by kmock's KubernetesEmulator over real HTTP to the
official client."""
from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes import client
from slice_api import endpoint_slice_api

from paged_router.discovery import EndpointSliceWatcher, slice_backends
from paged_router.metrics import RouterMetrics
from paged_router.pool import BackendPool

NS = "llm"
HTTP = {"name": "http", "port": 8000, "protocol": "TCP"}
PUB = {"name": "kv-events", "port": 5557, "protocol": "TCP"}
REPLAY = {"name": "kv-replay", "port": 5558, "protocol": "TCP"}


def endpoint_slice(name: str, endpoints: list[tuple[str, bool]], ports: list[dict]) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"kubernetes.io/service-name": "engine"}},
            "addressType": "IPv4", "ports": ports,
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}
                          for ip, ready in endpoints]}


def as_model(body: dict) -> client.V1EndpointSlice:
    """The client's own model of the slice, as the watcher receives it."""
    return client.V1EndpointSlice(
        metadata=client.V1ObjectMeta(**body["metadata"]), address_type=body["addressType"],
        ports=[client.DiscoveryV1EndpointPort(**p) for p in body["ports"]],
        endpoints=[client.V1Endpoint(addresses=e["addresses"], conditions=client.
                                     V1EndpointConditions(**e["conditions"]))
                   for e in body["endpoints"]])


def test_named_ports_give_each_ready_endpoint_its_event_endpoints():
    eps = as_model(endpoint_slice("e", [("10.0.0.5", True), ("10.0.0.6", False),
                                        ("fd00::7", True)], [REPLAY, HTTP, PUB]))
    assert slice_backends(eps, "engine", "http") == {
        "http://10.0.0.5:8000": ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558"),
        "http://[fd00::7]:8000": ("tcp://[fd00::7]:5557", "tcp://[fd00::7]:5558")}
    # no replay port: PUB only; no kv-events port: no event endpoints at all
    eps = as_model(endpoint_slice("e", [("10.0.0.5", True)], [HTTP, PUB]))
    assert slice_backends(eps, "engine", "http") == {
        "http://10.0.0.5:8000": ("tcp://10.0.0.5:5557", None)}
    eps = as_model(endpoint_slice("e", [("10.0.0.5", True)], [HTTP, REPLAY]))
    assert slice_backends(eps, "engine", "http") == {"http://10.0.0.5:8000": None}
    # another Service's slice gives nothing
    assert slice_backends(eps, "other", "http") == {}


def test_without_a_port_name_the_backend_port_is_never_an_event_port():
    # a slice lists its ports in no promised order: the event ports may come first
    eps = as_model(endpoint_slice("e", [("10.0.0.5", True)], [PUB, REPLAY, HTTP]))
    assert slice_backends(eps, "engine", None) == {
        "http://10.0.0.5:8000": ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")}
    # and a slice with event ports only serves no backend
    assert slice_backends(as_model(endpoint_slice("e", [("10.0.0.5", True)], [PUB, REPLAY])),
                          "engine", None) == {}


async def until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_watcher_keeps_the_given_endpoint_map_in_step_with_the_pool(tmp_path, monkeypatch):
    async with endpoint_slice_api(tmp_path, monkeypatch) as server:
        base = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
        await server.client.post(base, json=endpoint_slice(
            "engine-a", [("127.0.0.2", True), ("127.0.0.3", False)], [HTTP, PUB, REPLAY]))
        pool = BackendPool(RouterMetrics())
        shared: dict = {}  # e.g. a KVEventFollower's static endpoints
        seen_on_join: dict[str, object] = {}
        set_urls = pool.set_urls

        def record(urls):  # what the map holds when the pool hears of each backend
            for url in urls:
                seen_on_join.setdefault(url, shared.get(url))
            set_urls(urls)
        pool.set_urls = record
        watcher = EndpointSliceWatcher("engine", pool, namespace=NS, port_name="http",
                                       kv_events_endpoints=shared)
        assert watcher.kv_events_endpoints is shared
        await watcher.start()
        try:
            await until(lambda: [b.url for b in pool.all()] == ["http://127.0.0.2:8000"])
            assert shared == {"http://127.0.0.2:8000": ("tcp://127.0.0.2:5557",
                                                        "tcp://127.0.0.2:5558")}
            assert seen_on_join["http://127.0.0.2:8000"] == shared["http://127.0.0.2:8000"]
            # the second pod turns ready: it joins with its endpoints
            await server.client.patch(f"{base}/engine-a", json=endpoint_slice(
                "engine-a", [("127.0.0.2", True), ("127.0.0.3", True)], [HTTP, PUB, REPLAY]))
            await until(lambda: len(shared) == 2)
            assert shared["http://127.0.0.3:8000"] == ("tcp://127.0.0.3:5557",
                                                       "tcp://127.0.0.3:5558")
            # the policy changes away from precise: the ports go, so do the endpoints
            await server.client.patch(f"{base}/engine-a", json=endpoint_slice(
                "engine-a", [("127.0.0.2", True), ("127.0.0.3", True)], [HTTP]))
            await until(lambda: not shared)
            assert len(pool.all()) == 2
            await server.client.delete(f"{base}/engine-a")
            await until(lambda: not pool.all())
        finally:
            await watcher.stop()
