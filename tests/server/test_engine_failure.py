"""Engine faults. The server runs in-process (uvicorn in a thread) on a real engine whose
model runner or step is made to fail:

- the engine fails one request on its own (an output with `error`): only that HTTP
  request gets an error (500 JSON, or an SSE error event then [DONE]);
- a step raises (a device-looking fault the engine does not isolate per request): the
  requests in flight get a 500, a probe request runs alone and succeeds, and the engine
  goes on serving with no block leaked;
- a device fault that repeats on the probe: the engine is dead until restarted, /health
  and /livez turn 500, new requests 503.
"""
from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

import httpx
import pytest
import uvicorn

from engine.entrypoints.api_server import ServerSettings, build_app
from tests.server.conftest import scrape, wait_for

pytestmark = pytest.mark.xdist_group("server")
BODY = {"prompt": "until something breaks", "max_tokens": 40, "ignore_eos": True}


def _serve(factory: Callable[[], object]):
    app = build_app(engine_factory=factory, settings=ServerSettings())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def ready():
        try:
            return httpx.get(url + "/health").status_code == 200
        except httpx.HTTPError:
            return False
    assert wait_for(ready, timeout=120)
    return url, server, thread


@pytest.fixture(scope="module")
def faulty_server():
    """Requests whose X-Request-Id contains `bad-output` are failed by the engine itself
    (RequestOutput.error); a batch holding one whose id contains `bad-step` raises an
    error the engine takes for the device's, so `step()` itself raises."""
    from engine import LLMEngine

    def factory():
        engine = LLMEngine.from_args(max_model_len=256, num_gpu_blocks_override=64)
        execute, step = engine.runner.execute, engine.step

        def execute_or_raise(batch):
            if any("bad-step" in s.request_id for s in batch.seqs):
                raise RuntimeError("CUDA error: simulated fault of one step")
            return execute(batch)

        def step_failing_one_request():
            outs = step()
            for out in outs:
                if "bad-output" in out.request_id and not out.finished:
                    engine.abort_request(out.request_id)
                    out.finished = True
                    for c in out.outputs:
                        c.finish_reason = "error"
                    out.error = "simulated per-request fault"
            return outs

        engine.runner.execute, engine.step = execute_or_raise, step_failing_one_request
        return engine

    url, server, thread = _serve(factory)
    yield url
    server.should_exit = True
    thread.join(30)


def _sse_events(url: str, request_id: str) -> list[str]:
    with httpx.stream("POST", url + "/v1/completions", json={**BODY, "stream": True},
                      headers={"X-Request-Id": request_id}, timeout=60) as s:
        assert s.status_code == 200
        return [line[6:] for line in s.iter_lines() if line.startswith("data: ")]


def test_a_request_the_engine_fails_gets_an_error_others_do_not(faulty_server):
    url = faulty_server
    with httpx.Client(base_url=url, timeout=60) as http:
        results: dict[str, httpx.Response] = {}
        good = threading.Thread(target=lambda: results.update(
            good=http.post("/v1/completions", json=BODY)))
        good.start()
        bad = http.post("/v1/completions", json=BODY, headers={"X-Request-Id": "bad-output-1"})
        good.join(60)
        assert bad.status_code == 500, bad.text
        error = bad.json()["error"]
        assert error["code"] == "request_failed"
        assert "simulated per-request fault" in error["message"]
        assert results["good"].status_code == 200
        assert results["good"].json()["usage"]["completion_tokens"] == 40

    events = _sse_events(url, "bad-output-2")
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_failed"
    assert httpx.get(url + "/health").status_code == 200
    assert wait_for(lambda: scrape(url)["paged:num_used_blocks"] == 0, timeout=10)


def test_a_step_that_raises_fails_its_requests_and_the_engine_serves_on(faulty_server):
    url = faulty_server
    r = httpx.post(url + "/v1/completions", json=BODY, headers={"X-Request-Id": "bad-step-1"},
                   timeout=60)
    assert r.status_code == 500, r.text
    assert r.json()["error"]["code"] == "engine_step_failed"
    assert "simulated fault of one step" in r.json()["error"]["message"]
    events = _sse_events(url, "bad-step-2")
    assert events[-1] == "[DONE]" and "engine_step_failed" in events[-2]
    # the engine probed itself and goes on
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/livez").status_code == 200
    ok = httpx.post(url + "/v1/completions", json=BODY, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 40
    metrics = scrape(url)
    assert metrics["paged:engine_step_failures_total"] == 2
    assert wait_for(lambda: scrape(url)["paged:num_used_blocks"] == 0, timeout=10)


@pytest.fixture()
def dying_server():
    from engine import LLMEngine

    def factory():
        engine = LLMEngine.from_args(max_model_len=256, num_gpu_blocks_override=64)
        execute, calls = engine.runner.execute, {"n": 0}

        def execute_then_fail(batch):
            calls["n"] += 1
            if calls["n"] > 12:  # past the warm-up and a few user steps: for good
                raise RuntimeError("CUDA error: simulated device fault")
            return execute(batch)

        engine.runner.execute = execute_then_fail
        return engine

    url, server, thread = _serve(factory)
    yield url
    server.should_exit = True
    thread.join(30)


def test_a_fault_that_repeats_on_the_probe_kills_the_engine(dying_server):
    url = dying_server
    body = {**BODY, "max_tokens": 100}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 500 and "simulated device fault" in r.json()["error"]["message"]
    for probe in ("/health", "/ready", "/livez"):
        assert httpx.get(url + probe).status_code == 500, probe
    again = httpx.post(url + "/v1/completions", json=body, timeout=10)
    assert again.status_code == 503 and again.json()["error"]["code"] == "engine_dead"
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=10) as s:
        assert s.status_code == 503
