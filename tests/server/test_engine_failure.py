"""A step that raises: in-flight requests get an error (never hang), liveness turns 500,
new requests get 503. The server runs in-process (uvicorn in a thread) on a real engine
whose model runner is made to fail after a few steps."""
from __future__ import annotations

import socket
import threading

import httpx
import pytest
import uvicorn

from engine.entrypoints.api_server import ServerSettings, build_app
from tests.server.conftest import wait_for

pytestmark = pytest.mark.xdist_group("server")


@pytest.fixture()
def failing_server():
    from engine import LLMEngine

    def factory():
        engine = LLMEngine.from_args(max_model_len=256, num_gpu_blocks_override=64)
        execute, calls = engine.runner.execute, {"n": 0}

        def execute_then_fail(batch):
            calls["n"] += 1
            if calls["n"] > 12:  # past the warm-up and a few user steps
                raise RuntimeError("simulated device fault")
            return execute(batch)

        engine.runner.execute = execute_then_fail
        return engine

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
            return httpx.get(url + "/ready").status_code == 200
        except httpx.HTTPError:
            return False
    assert wait_for(ready, timeout=120)
    yield url
    server.should_exit = True
    thread.join(30)


def test_engine_failure_fails_requests_and_liveness(failing_server):
    url = failing_server
    body = {"prompt": "until the device breaks", "max_tokens": 100, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 500 and "simulated device fault" in r.json()["error"]["message"]
    assert httpx.get(url + "/health").status_code == 500
    assert httpx.get(url + "/ready").status_code == 503
    again = httpx.post(url + "/v1/completions", json=body, timeout=10)
    assert again.status_code == 503 and again.json()["error"]["code"] == "engine_dead"
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=10) as s:
        assert s.status_code == 503
