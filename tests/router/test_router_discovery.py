"""`--discover SERVICE`: the router follows the EndpointSlices of the engine Service, served
by kmock's KubernetesEmulator over real HTTP to the official `kubernetes` client."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from router_fakes import FakeBackend
from router_harness import RouterThread
from slice_api import endpoint_slice_api

NS = "llm"


def endpoint_slice(name: str, service: str, endpoints: list[tuple[str, bool | None]],
                   port: int) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip],
                           **({} if ready is None else {"conditions": {"ready": ready}})}
                          for ip, ready in endpoints]}


async def until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_pods_join_when_ready_and_leave_when_not(tmp_path, monkeypatch):
    # every fake listens on the same port number on its own loopback address, as pods do
    with FakeBackend("127.0.0.2") as a:
        port = int(a.url.rsplit(":", 1)[1])
        with FakeBackend("127.0.0.3", port=port) as b, FakeBackend("127.0.0.4", port=port) as c:
            await _scenario(tmp_path, monkeypatch, port, a, b, c)


async def _scenario(tmp_path, monkeypatch, port, a, b, c) -> None:
    async with endpoint_slice_api(tmp_path, monkeypatch) as server:
        api = server.client
        base = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
        # one pod ready, one starting; and a slice of another Service on the same pods
        await api.post(base, json=endpoint_slice(
            "engine-abc", "engine", [("127.0.0.2", True), ("127.0.0.3", False)], port))
        await api.post(base, json=endpoint_slice(
            "other-xyz", "other", [("127.0.0.4", True)], port))
        router = RouterThread(discover="engine", namespace=NS, port_name="http")
        await asyncio.to_thread(router.__enter__)
        try:
            def urls() -> list[str]:
                return [x.url for x in router.pool.available()]

            await until(lambda: urls() == [a.url])
            r = await asyncio.to_thread(httpx.post, router.url + "/v1/completions",
                                        json={"prompt": "hi"})
            assert r.json()["served_by"] == a.url
            # the second pod becomes ready; a new slice adds a third (ready unset = ready)
            await api.patch(f"{base}/engine-abc", json=endpoint_slice(
                "engine-abc", "engine", [("127.0.0.2", True), ("127.0.0.3", True)], port))
            await api.post(base, json=endpoint_slice(
                "engine-def", "engine", [("127.0.0.4", None)], port))
            await until(lambda: urls() == [a.url, b.url, c.url])
            # the first pod goes unready, then the second slice disappears
            await api.patch(f"{base}/engine-abc", json=endpoint_slice(
                "engine-abc", "engine", [("127.0.0.2", False), ("127.0.0.3", True)], port))
            await until(lambda: urls() == [b.url, c.url])
            await api.delete(f"{base}/engine-def")
            await until(lambda: urls() == [b.url])
            r = await asyncio.to_thread(httpx.post, router.url + "/v1/completions",
                                        json={"prompt": "hi"})
            assert r.json()["served_by"] == b.url
        finally:
            await asyncio.to_thread(router.__exit__)


@pytest.mark.asyncio
async def test_precise_follows_the_event_ports_the_endpoint_slices_name(tmp_path, monkeypatch):
    """The engine's /kv_events answers 404 here: only the slice's kv-events / kv-replay
    ports (as the operator publishes them) can lead the router to its events."""
    from engine.kv_events import KVEventRecorder, ZmqKVEventPublisher, block_stored
    from engine.model_loader import resolve_model_path

    publisher = ZmqKVEventPublisher({"endpoint": "tcp://127.0.0.2:*",
                                     "replay_endpoint": "tcp://127.0.0.2:*"},
                                    KVEventRecorder(block_size=16))
    try:
        with FakeBackend("127.0.0.2") as a:
            port = int(a.url.rsplit(":", 1)[1])
            ports = [{"name": "http", "port": port, "protocol": "TCP"},
                     {"name": "kv-events", "protocol": "TCP",
                      "port": int(publisher.endpoint.rsplit(":", 1)[1])},
                     {"name": "kv-replay", "protocol": "TCP",
                      "port": int(publisher.replay_endpoint.rsplit(":", 1)[1])}]
            async with endpoint_slice_api(tmp_path, monkeypatch) as server:
                body = endpoint_slice("engine-abc", "engine", [("127.0.0.2", True)], port)
                body["ports"] = ports
                await server.client.post(
                    f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices", json=body)
                router = RouterThread(discover="engine", namespace=NS, port_name="http",
                                      policy="precise",
                                      tokenizer=str(resolve_model_path(None)))
                await asyncio.to_thread(router.__enter__)
                try:
                    publisher.recorder.pending.append(block_stored([7, 8], None, [], 16))
                    publisher.flush()
                    await until(lambda: router.policy.index.size(a.url) == 2)
                finally:
                    await asyncio.to_thread(router.__exit__)
    finally:
        publisher.close()
