"""The router over real HTTP in front of small fake backends: retry, ejection, streaming,
disconnects, auth, its own endpoints."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from router_fakes import FakeBackend
from router_harness import RouterThread


def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture()
def fakes():
    with FakeBackend("127.0.0.2") as a, FakeBackend("127.0.0.3") as b, \
            FakeBackend("127.0.0.4") as c:
        yield [a, b, c]


def test_a_503_before_streaming_is_retried_once_on_the_next_backend_and_ejects(fakes):
    with RouterThread(backends=[f.url for f in fakes], policy="round-robin") as router:
        first = router.pool.available()[0]
        failing = next(f for f in fakes if f.url == first.url)
        failing.fail_next(1, 503, then_unhealthy=True)  # out until /health answers 200
        r = httpx.post(router.url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 200 and r.json()["served_by"] != failing.url
        assert r.headers["x-routed-to"] == r.json()["served_by"]
        assert len(failing.requests) == 1
        assert router.sample("paged_router_retries_total", reason="status_503") == 1
        assert router.sample("paged_router_ejections_total", backend=failing.url,
                             reason="status_503") == 1
        assert router.sample("paged_router_requests_total", backend=r.json()["served_by"],
                             decision="retry") == 1
        for _ in range(4):  # ejected: round-robin skips it
            assert httpx.post(router.url + "/v1/completions",
                              json={"prompt": "x"}).json()["served_by"] != failing.url
        failing.health_status = 200  # the /health probe brings it back
        wait_for(lambda: len(router.pool.available()) == 3)


def test_a_refused_connection_is_retried_on_the_next_backend(fakes):
    # no probe between closing the backend and the request: the request finds it closed
    with RouterThread(backends=[f.url for f in fakes], policy="round-robin",
                      health_interval=60) as router:
        order = [b.url for b in router.pool.available()]
        wait_for(lambda: all(f.probes for f in fakes))  # the start-up probe is done
        next(f for f in fakes if f.url == order[0]).close()
        r = httpx.post(router.url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 200 and r.json()["served_by"] == order[1]
        assert router.sample("paged_router_retries_total", reason="connect_failed") == 1
        assert [b.url for b in router.pool.available()] == order[1:]


def test_a_connection_dropped_before_the_answer_is_retried_on_the_next_backend(fakes):
    with RouterThread(backends=[f.url for f in fakes], policy="round-robin",
                      health_interval=60) as router:
        order = [b.url for b in router.pool.available()]
        dropping = next(f for f in fakes if f.url == order[0])
        dropping.fail_next(1, 0)  # reads the request, then resets the connection
        r = httpx.post(router.url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 200 and r.json()["served_by"] == order[1]
        assert len(dropping.requests) == 1
        assert router.sample("paged_router_retries_total", reason="dropped") == 1
        assert router.sample("paged_router_ejections_total", backend=dropping.url,
                             reason="dropped") == 1


def test_retry_happens_once_then_the_backends_answer_goes_to_the_client(fakes):
    for f in fakes:
        f.fail_next(1, 503)
    with RouterThread(backends=[f.url for f in fakes], policy="round-robin") as router:
        r = httpx.post(router.url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503
        assert sorted(len(f.requests) for f in fakes) == [0, 1, 1]  # the pick and one retry
        assert router.sample("paged_router_retries_total", reason="status_503") == 1


def test_no_retry_after_the_first_streamed_byte(fakes):
    a, b, c = fakes
    a.tokens, a.itl = 50, 0.05
    with RouterThread(backends=[a.url, b.url, c.url], policy="round-robin") as router:
        with httpx.stream("POST", router.url + "/v1/completions",
                          json={"prompt": "p", "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            a.close()  # the backend dies mid-stream
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
        assert b.requests == [] and c.requests == []
        assert router.sample("paged_router_retries_total", reason="connect_failed") == 0


def test_sse_passes_through_as_it_is_produced(fakes):
    a = fakes[0]
    a.tokens, a.itl = 3, 0.3
    with RouterThread(backends=[a.url]) as router:
        stamps, chunks = [], []
        start = time.monotonic()
        with httpx.stream("POST", router.url + "/v1/completions",
                          json={"prompt": "p", "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line:
                    stamps.append(time.monotonic() - start)
                    chunks.append(line)
        assert chunks[-1] == "data: [DONE]"
        assert [json.loads(c[6:])["choices"][0]["text"] for c in chunks[:-1]] == \
            ["t0 ", "t1 ", "t2 "]
        # each event passes as it is produced: 0.9 s of backend gaps separate first and last
        # (a buffering proxy would deliver them together)
        assert stamps[-1] - stamps[0] > 0.6


def test_a_client_disconnect_aborts_the_upstream_request(fakes):
    a = fakes[0]
    a.tokens, a.itl = 100, 0.05
    with RouterThread(backends=[a.url]) as router:
        with httpx.stream("POST", router.url + "/v1/completions",
                          json={"prompt": "p", "stream": True}) as r:
            next(r.iter_lines())
        wait_for(lambda: a.abandoned == 1 and a.in_flight == 0)
        wait_for(lambda: router.pool.available()[0].in_flight == 0)
        a.delay = 5.0  # not streaming: the client leaves while the backend still works
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(router.url + "/v1/completions", json={"prompt": "p"}, timeout=0.5)
        wait_for(lambda: a.abandoned == 2 and a.in_flight == 0)
        wait_for(lambda: router.pool.available()[0].in_flight == 0)


def test_a_client_leaving_before_the_first_token_aborts_the_upstream_request(fakes):
    a = fakes[0]
    a.ttft = 5.0  # the stream's headers at once, then a long prefill
    with RouterThread(backends=[a.url]) as router:
        with httpx.stream("POST", router.url + "/v1/completions",
                          json={"prompt": "p", "stream": True}) as r:
            assert r.status_code == 200  # headers relayed; the client leaves before a token
        # at once, not when the first token would have come
        wait_for(lambda: a.abandoned == 1 and a.in_flight == 0, timeout=3.0)
        wait_for(lambda: router.pool.available()[0].in_flight == 0)


def test_upstream_connections_are_kept_alive_between_requests(fakes):
    a = fakes[0]
    with RouterThread(backends=[a.url]) as router:
        for i in range(6):
            r = httpx.post(router.url + "/v1/completions",
                           json={"prompt": "p", "stream": i % 2 == 0})
            assert r.status_code == 200
        assert len(a.requests) == 6 and len(a.connections) == 1


def test_api_key_is_checked_and_the_header_forwarded(fakes):
    a = fakes[0]
    with RouterThread(backends=[a.url], api_key="sk-router") as router:
        r = httpx.post(router.url + "/v1/completions", json={"prompt": "p"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(router.url + "/v1/models",
                         headers={"Authorization": "Bearer nope"}).status_code == 401
        assert a.requests == []
        auth = {"Authorization": "Bearer sk-router"}
        assert httpx.post(router.url + "/v1/completions", json={"prompt": "p"},
                          headers=auth).status_code == 200
        assert a.headers[-1]["Authorization"] == "Bearer sk-router"
        assert httpx.get(router.url + "/v1/models", headers=auth).json()["data"][0]["id"] == \
            "fake"
        assert httpx.get(router.url + "/health").status_code == 200  # open, like the engine's


def test_bad_bodies_get_a_400_that_says_what_to_send(fakes):
    with RouterThread(backends=[fakes[0].url]) as router:
        for body in (b"{not json", b"[1, 2]"):
            r = httpx.post(router.url + "/v1/chat/completions", content=body)
            assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_health_and_metrics_report_the_backends(fakes):
    a, b, _ = fakes
    with RouterThread(backends=[a.url, b.url]) as router:
        assert httpx.get(router.url + "/health").json()["healthy_backends"] == 2
        a.health_status = b.health_status = 503
        wait_for(lambda: httpx.get(router.url + "/health").status_code == 503)
        r = httpx.post(router.url + "/v1/completions", json={"prompt": "p"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_backend"
        text = httpx.get(router.url + "/metrics").text
        for name in ("paged_router_requests_total", "paged_router_retries_total",
                     "paged_router_ejections_total", "paged_router_estimated_prefix_hit_rate",
                     "paged_router_added_latency_seconds_bucket",
                     'paged_router_backends{state="ejected"} 2.0'):
            assert name in text


def test_least_load_reads_the_scraped_kv_usage(fakes):
    a, b, c = fakes
    a.kv_cache_usage, b.kv_cache_usage, c.kv_cache_usage = 0.9, 0.1, 0.5
    with RouterThread(backends=[a.url, b.url, c.url], policy="least-load") as router:
        wait_for(lambda: router.pool.get(a.url).kv_cache_usage == 0.9)
        served = {httpx.post(router.url + "/v1/completions",
                             json={"prompt": f"{i}"}).json()["served_by"] for i in range(4)}
        assert served == {b.url}
