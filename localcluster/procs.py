"""Background processes of the local cluster: start detached, wait until ready, stop by pid.

Every process runs in its own session (process group), so stopping it also stops its
children, and a `down` after a crash can still stop what a dead `up` left behind: the pids
are recorded in DIR/pids.json, each with its start time so a recycled pid is never killed.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, started: str | None = None) -> bool:
    now = start_time(pid)
    if now is None:
        return False
    if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
        return False  # a zombie: exited, not yet reaped by its parent
    return started is None or now == started


@dataclass
class Proc:
    """A detached process this package started; `stop()` ends its whole process group."""
    name: str
    pid: int
    started: str | None
    url: str = ""
    popen: subprocess.Popen | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return alive(self.pid, self.started)

    def stop(self, grace: float = 10.0) -> None:
        stop_group(self.pid, self.started, grace)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

    def record(self) -> dict:
        return {"name": self.name, "pid": self.pid, "started": self.started, "url": self.url}


def spawn(name: str, argv: list[str], log: Path, *, env: dict[str, str] | None = None,
          cwd: str | Path | None = None, user: str | None = None, url: str = "") -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                 start_new_session=True, user=user,
                                 group=user, extra_groups=[] if user else None)
    return Proc(name, popen.pid, start_time(popen.pid), url, popen)


def stop_group(pid: int, started: str | None = None, grace: float = 10.0) -> bool:
    """SIGTERM the process group led by pid, SIGKILL it after `grace`; False if already gone."""
    if not alive(pid, started):
        return False
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid, started):
                return True
            time.sleep(0.05)
    return True


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None,
               log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and not proc.alive():
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{what}: the process exited; its log ({log}) ends:\n{tail}")
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s; log ({log}) ends:\n{tail}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def save_pids(path: Path, procs: list[Proc]) -> None:
    path.write_text(json.dumps([p.record() for p in procs], indent=1))


def load_pids(path: Path) -> list[Proc]:
    if not path.exists():
        return []
    return [Proc(r["name"], r["pid"], r.get("started"), r.get("url", ""))
            for r in json.loads(path.read_text())]
