"""Starting and stopping one engine server per trial (a subprocess, its own process group,
killed by the kernel if the tuner dies: tuner.measure.lifeline).

A start that fails (the process exits, or /ready, else /health, never answers 200 in
time) raises EngineStartError with a one-line reason taken from the end of the engine's
log, so the sweep can record the trial as infeasible and go on.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tuner.measure.lifeline import die_with_parent

DEFAULT_ENGINE_CMD = f"{shlex.quote(sys.executable)} -m engine serve"
_OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|cannot allocate|no memory left|"
                  r"not enough (memory|KV|blocks)|insufficient memory", re.IGNORECASE)


_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:,.]+\s+[A-Z]+\s+[\w.]+:\s*")


class EngineStartError(RuntimeError):
    """The engine did not become ready; `reason` is short and human-readable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def failure_reason(log_text: str, returncode: int | None) -> str:
    """A one-line reason from an engine log: OOM first, else the last error-looking line."""
    # Drop logging prefixes ("2026-01-01 10:00:00,000 ERROR engine.server: ").
    lines = [_PREFIX.sub("", line.strip()) for line in log_text.splitlines() if line.strip()]
    oom = [line for line in lines if _OOM.search(line)]
    if oom:
        return f"out of memory: {oom[-1][:240]}"
    if returncode is not None and returncode in (-signal.SIGKILL, 137):
        return "killed (SIGKILL; likely the kernel's OOM killer)"
    errors = [line for line in lines if re.search(r"error|exception|invalid|fail|usage:", line, re.I)]
    tail = (errors or lines or ["(no output)"])[-1][:240]
    code = "" if returncode is None else f"exit code {returncode}: "
    return code + tail


class EngineProcess:
    """`python -m engine serve [MODEL] --host 127.0.0.1 --port P <flags>` as a child."""

    def __init__(self, *, flags: list[str], model: str | None = None, log_path: Path,
                 engine_cmd: str = DEFAULT_ENGINE_CMD, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.command = [*shlex.split(engine_cmd), *([model] if model else []),
                        "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self._env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen | None = None

    def start(self, *, timeout: float) -> None:
        """Launch and wait for `ready()`; EngineStartError otherwise (process stopped)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + shlex.join(self.command) + "\n").encode())
            log.flush()
            try:
                self._proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=self._env,
                                              start_new_session=True,
                                              preexec_fn=die_with_parent())
            except OSError as exc:
                raise EngineStartError(f"cannot run {self.command[0]}: {exc}") from None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EngineStartError(failure_reason(self.log_text(), self._proc.returncode))
            if self.ready():
                return
            time.sleep(0.25)
        self.stop()
        raise EngineStartError(f"not ready after {timeout:.0f} s (see {self.log_path})")

    def ready(self) -> bool:
        """/ready == 200; for a server without /ready (404), /health == 200 (vLLM's and
        this engine's readiness: 200 only once the model is loaded)."""
        try:
            code = httpx.get(self.url + "/ready", timeout=2).status_code
            if code == 404:
                code = httpx.get(self.url + "/health", timeout=2).status_code
        except httpx.HTTPError:
            return False
        return code == 200

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, *, grace: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL after `grace` seconds."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
