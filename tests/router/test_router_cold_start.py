"""--cold-start-hold: with no healthy backend (a service scaled to zero), a request waits
for the first one instead of a 503 at once, is served when it comes, and the number waiting
is on /metrics (what the SLO planner reads to bring a replica back); beyond the queue's
bound, or the hold's time, a 503 with Retry-After."""
from __future__ import annotations

import threading
import time

import httpx
from router_fakes import FakeBackend
from router_harness import RouterThread


def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def post_in_thread(url: str, out: list) -> threading.Thread:
    def post():
        out.append(httpx.post(url + "/v1/completions", json={"prompt": "p"}, timeout=30))
    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def down(router: RouterThread, backend: FakeBackend) -> httpx.Response:
    """The backend stops serving; the router's /health once it has seen that."""
    backend.health_status = 503
    wait_for(lambda: httpx.get(router.url + "/health").json()["healthy_backends"] == 0)
    return httpx.get(router.url + "/health")


def test_a_held_request_is_served_when_the_first_backend_comes_back():
    with FakeBackend("127.0.0.2") as engine, \
            RouterThread(backends=[engine.url], hold_seconds=20.0, max_held=2) as router:
        # a holding router stays ready with no replica: its Service (and kubelet) must
        # keep sending it requests to hold
        health = down(router, engine)
        assert health.status_code == 200 and health.json()["holding"] is True
        got: list = []
        threads = [post_in_thread(router.url, got) for _ in range(2)]
        wait_for(lambda: router.sample("paged_router_held_requests") == 2)
        assert got == [] and 'paged_router_held_requests 2.0' in httpx.get(
            router.url + "/metrics").text
        # a third one is beyond the queue's bound: refused at once, told when to retry
        third = httpx.post(router.url + "/v1/completions", json={"prompt": "p"}, timeout=5)
        assert third.status_code == 503 and third.headers["Retry-After"] == "20"
        assert "2 requests already wait" in third.json()["error"]["message"]
        engine.health_status = 200          # the first replica is ready
        for thread in threads:
            thread.join(20)
        assert [r.status_code for r in got] == [200, 200]
        assert router.sample("paged_router_held_requests") == 0
        assert router.sample("paged_router_failed_requests_total",
                             reason="hold_queue_full") == 1


def test_a_hold_that_ends_without_a_backend_is_a_503_and_without_hold_it_is_at_once():
    with FakeBackend("127.0.0.3") as engine:
        with RouterThread(backends=[engine.url], hold_seconds=0.5) as router:
            assert down(router, engine).status_code == 200
            t = time.monotonic()
            r = httpx.post(router.url + "/v1/completions", json={"prompt": "p"}, timeout=10)
            assert r.status_code == 503 and time.monotonic() - t >= 0.5
            assert r.json()["error"]["code"] == "no_healthy_backend"
            assert router.sample("paged_router_held_requests") == 0
        with RouterThread(backends=[engine.url]) as router:   # the default: no hold
            health = down(router, engine)
            assert health.status_code == 503 and "holding" not in health.json()
            r = httpx.post(router.url + "/v1/completions", json={"prompt": "p"}, timeout=10)
            assert r.status_code == 503 and router.sample("paged_router_held_requests") == 0
