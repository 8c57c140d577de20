"""The router under test: in a thread of the test process (real uvicorn, real HTTP on a
loopback port) or as `python -m paged_router` in a subprocess; real engines likewise."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from paged_router.app import RouterConfig, build_app

REPO = Path(__file__).resolve().parents[2]


class RouterThread:
    def __init__(self, **config: Any) -> None:
        config.setdefault("health_interval", 0.2)
        self.app = build_app(RouterConfig(**config))
        self.pool, self.policy, self.metrics = (self.app.state.pool, self.app.state.policy,
                                                self.app.state.metrics)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_config=None, lifespan="on",
                                                    access_log=False, log_level="warning",
                                                    http="httptools"))  # as the CLI's
        self.url = ""

    def __enter__(self) -> "RouterThread":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "router did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.should_exit = True
        self._thread.join(10)

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


class Process:
    """A subprocess printing '... on http://HOST:PORT' once it listens."""

    def __init__(self, args: list[str], pattern: str, ready_path: str | None = "/health",
                 timeout: float = 120.0) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        seen = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(pattern + r" (http://[0-9.]+:\d+)", line)
                if m and not seen.is_set():
                    self.url = m.group(1)
                    seen.set()

        threading.Thread(target=pump, daemon=True).start()
        if not seen.wait(60):
            self.kill()
            raise RuntimeError("process did not listen:\n" + "".join(self.lines))
        deadline = time.monotonic() + timeout
        while ready_path is not None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("process never became ready:\n" + "".join(self.lines))
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def engine(host: str, *extra: str) -> Process:
    """`python -m engine serve` on the tiny default model, one CPU thread."""
    return Process(["engine", "serve", "--host", host, "--port", "0", "--cpu-threads", "1",
                    "--max-model-len", "512", "--seed", "0", *extra], "serving on")


def router(backends: list[str], *extra: str) -> Process:
    return Process(["paged_router", "--host", "127.0.0.1", "--port", "0", "--backends",
                    ",".join(backends), "--health-interval", "0.2", *extra], "routing on")
