"""A full queue answers 503 with Retry-After and recovers; too many connections get 503;
SIGTERM drains, ends what is left with an error event and [DONE], then exits 0.

One small server (2 running + 1 waiting admitted; 12 connections; 4 s grace), used in
file order: the last test shuts it down.
"""
from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, ServerProcess, scrape, wait_for

pytestmark = pytest.mark.xdist_group("server")

GRACE = 4.0
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def small_server():
    # Long contexts, so that the "long" requests below cannot finish during a test.
    proc = ServerProcess("--max-model-len", "2048", "--num-gpu-blocks-override", "400",
                         "--max-num-seqs", "2", "--max-waiting-requests", "1",
                         "--shutdown-grace-period", str(GRACE), "--api-key", API_KEY,
                         "--access-log-prompts", "--limit-concurrency", "12")
    yield proc
    proc.stop()


class Stream(threading.Thread):
    """A streaming completion read in the background; records chunks and how it ended."""

    def __init__(self, base_url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.base_url, self.max_tokens = base_url, max_tokens
        self.status: int | None = None
        self.events: list[str] = []
        self.error: BaseException | None = None
        self.started = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        body = {"prompt": "keep talking", "max_tokens": self.max_tokens, "stream": True,
                "ignore_eos": True}
        try:
            with httpx.stream("POST", self.base_url + "/v1/completions", json=body,
                              headers=HEADERS, timeout=120) as r:
                self.status = r.status_code
                self.started.set()  # headers are sent before the first token
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                    if self.stop.is_set():
                        return  # leaving the block closes the connection: a disconnect
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.started.set()

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


def test_full_queue_gets_503_with_retry_after_then_recovers(small_server):
    url = small_server.base_url
    streams = [Stream(url, 1500) for _ in range(3)]  # capacity: 2 running + 1 waiting
    for s in streams:
        s.start()
        assert s.started.wait(60) and s.status == 200
    assert wait_for(lambda: (lambda m: m["vllm:num_requests_running"] == 2
                             and m["vllm:num_requests_waiting"] == 1)(scrape(url)), timeout=10)
    refused = httpx.post(url + "/v1/completions", headers=HEADERS,
                         json={"prompt": "one more", "max_tokens": 1})
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "queue_full"
    for s in streams:
        s.stop.set()
    for s in streams:
        s.join(30)

    def served() -> bool:
        r = httpx.post(url + "/v1/completions", headers=HEADERS,
                       json={"prompt": "one more", "max_tokens": 1})
        return r.status_code == 200
    assert wait_for(served, timeout=20, interval=0.3)
    assert wait_for(lambda: scrape(url)["paged:num_used_blocks"] == 0, timeout=10)


def test_api_key_guards_v1_but_not_probes(small_server):
    url = small_server.base_url
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = httpx.post(url + "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    good = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    assert good.models.list().data[0].id
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        assert httpx.post(url + path, json=body).status_code == 401, path
        assert httpx.post(url + path, json=body, headers=HEADERS).status_code == 200, path
    # probes and metrics stay open for kubelets and Prometheus
    for path in ("/health", "/ready", "/metrics", "/version"):
        assert httpx.get(url + path).status_code == 200, path
    assert API_KEY not in small_server.log


def test_access_log_prompts_flag_logs_the_prompt(small_server):
    httpx.post(small_server.base_url + "/v1/completions", headers={
        **HEADERS, "X-Request-Id": "logged"}, json={"prompt": "visible-prompt", "max_tokens": 1})
    lines = wait_for(lambda: [x for x in small_server.lines if "request_id=logged" in x])
    assert lines
    line = lines[0]
    assert "prompt=['visible-prompt']" in line


def test_connections_beyond_the_limit_get_503(small_server):
    idle = [socket.create_connection(("127.0.0.1", small_server.port)) for _ in range(12)]
    try:
        assert wait_for(lambda: httpx.get(small_server.base_url + "/health").status_code == 503,
                        timeout=5)
    finally:
        for sock in idle:
            sock.close()
    assert wait_for(lambda: httpx.get(small_server.base_url + "/health").status_code == 200,
                    timeout=5)


def test_sigterm_finishes_short_requests_ends_long_ones_cleanly_and_exits_0(small_server):
    url = small_server.base_url
    short, long_ = Stream(url, 6), Stream(url, 2000)
    for s in (short, long_):
        s.start()
        assert s.started.wait(60) and s.status == 200
    assert wait_for(lambda: short.events and long_.events, timeout=30)  # both running
    t0 = time.monotonic()
    small_server.proc.send_signal(signal.SIGTERM)
    # stops accepting at once ...
    assert wait_for(lambda: _refused(url), timeout=5)
    # ... while the in-flight short stream runs to its end
    short.join(30)
    assert short.done, short.events[-3:]
    assert '"finish_reason": "length"' in short.events[-2]
    # the long one ends when the grace period does: an error event, then [DONE]
    assert small_server.proc.wait(GRACE + 30) == 0
    assert time.monotonic() - t0 >= GRACE - 0.5, (long_.events[-2:], long_.error)
    long_.join(10)
    assert long_.done, (long_.events[-2:], long_.error)
    assert json.loads(long_.events[-2])["error"]["code"] == "server_shutdown"
    assert "ended 1 open request(s)" in small_server.log
    assert "Traceback" not in small_server.log


def _refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=1)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False
