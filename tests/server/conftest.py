"""Real servers for the server tests: `python -m engine serve` in a subprocess.

Each server binds port 0 and prints the port it got; fixtures wait on `/health`, and
stop the process (SIGTERM, then SIGKILL) afterwards. Every test in tests/server runs in
one xdist group (`pytestmark` in each module), so the session-scoped server starts
once per run.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key"  # the small server of test_admission_and_shutdown requires it
# The tiny default model; a fixed pool keeps block counts exact and start-up fast.
# No API key here: the Locust workloads send none.
# A short header-read timeout, so the slow-header test need not wait 10 s.
MAIN_ARGS = ["--max-model-len", "512", "--num-gpu-blocks-override", "256",
             "--max-num-seqs", "16", "--seed", "0", "--header-read-timeout", "2"]


class ServerProcess:
    def __init__(self, *args: str, ready_timeout: float = 180.0, wait_ready: bool = True
                 ) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1", "--port", "0",
             *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        self.lines: list[str] = []
        port_seen = threading.Event()
        self.port = 0

        def pump() -> None:  # keep the pipe drained; remember the log for assertions
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.match(r"serving on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    port_seen.set()

        threading.Thread(target=pump, daemon=True).start()
        if not port_seen.wait(60):
            self.stop()
            raise RuntimeError("server did not bind:\n" + self.log)
        self.base_url = f"http://127.0.0.1:{self.port}"
        if wait_ready:
            self._wait_ready(ready_timeout)

    def _wait_ready(self, ready_timeout: float) -> None:
        # What the probes said while the model was loading (status codes), for the tests.
        self.during_load: dict[str, int] = {}
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited during start-up:\n" + self.log)
            try:
                status = httpx.get(self.base_url + "/health", timeout=2).status_code
                if status == 200:
                    return
                if not self.during_load:
                    self.during_load = {
                        "health": status,
                        "ready": httpx.get(self.base_url + "/ready").status_code,
                        "livez": httpx.get(self.base_url + "/livez").status_code,
                        "completions": httpx.post(self.base_url + "/v1/completions",
                                                  json={"prompt": "x"}).status_code}
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("server never became ready:\n" + self.log)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    proc = ServerProcess(*MAIN_ARGS)
    yield proc
    proc.stop()


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


@pytest.fixture()
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture()
def async_client(server):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0,
                       timeout=120)


def scrape(base_url: str) -> dict[str, float]:
    """/metrics parsed by prometheus_client: {'name{label=value,...}': value} per sample,
    labels sorted, model_name left out (there is one model)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                              if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def wait_for(predicate, *, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
