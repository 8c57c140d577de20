"""Running a Locust workload headless as a subprocess.

Locust runs in its own process because importing it monkey-patches the interpreter with
gevent, which must not touch the tuner (threads, SQLAlchemy). The command is

  python -m locust -f loadtests/<workload>.py --headless -u U -r U -t <duration>s
         --host URL --csv <prefix> --only-summary --exit-code-on-error 0 --stop-timeout 0
         --samples-file <file> --seed S --arrival closed|open --rate R --length-scale F

and the raw per-request samples come back through --samples-file (loadtests/common.py).
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
LOADTESTS = REPO_ROOT / "loadtests"


class LoadError(RuntimeError):
    """Locust itself failed (not the server): a harness problem, not an infeasible trial."""


@dataclass(frozen=True)
class LoadSpec:
    workload: str
    duration: float            # seconds of load
    users: int                 # closed loop: concurrency; open loop: arrival processes
    arrival: str = "closed"    # "closed" | "open"
    rate: float = 1.0          # open loop: total requests/s
    seed: int = 0
    length_scale: float = 1.0
    model_name: str | None = None


def locust_command(spec: LoadSpec, *, url: str, samples: Path, csv_prefix: Path) -> list[str]:
    users = str(max(1, spec.users))
    command = [sys.executable, "-m", "locust", "-f", str(LOADTESTS / f"{spec.workload}.py"),
               "--headless", "-u", users, "-r", users, "-t", f"{math.ceil(spec.duration)}s",
               "--host", url, "--csv", str(csv_prefix), "--only-summary",
               "--exit-code-on-error", "0", "--stop-timeout", "0", "--loglevel", "WARNING",
               "--samples-file", str(samples), "--seed", str(spec.seed),
               "--arrival", spec.arrival, "--rate", str(spec.rate),
               "--length-scale", str(spec.length_scale)]
    if spec.model_name:
        command += ["--model-name", spec.model_name]
    return command


def run_load(spec: LoadSpec, *, url: str, workdir: Path,
             on_progress: Callable[[float], bool] | None = None,
             progress_interval: float = 2.0) -> Path:
    """Run the workload against `url`; returns the samples file.

    `on_progress(elapsed_s)` is called every `progress_interval` seconds; returning True
    stops the load early (pruning). LoadError when Locust fails or overruns.
    """
    workdir = workdir.resolve()  # Locust runs with workdir as its cwd
    workdir.mkdir(parents=True, exist_ok=True)
    samples, log_path = workdir / "samples.jsonl", workdir / "locust.log"
    samples.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    command = locust_command(spec, url=url, samples=samples, csv_prefix=workdir / "locust")
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=workdir,
                                start_new_session=True)
        try:
            while True:
                try:
                    proc.wait(timeout=progress_interval)
                    break
                except subprocess.TimeoutExpired:
                    pass
                elapsed = time.monotonic() - start
                if elapsed > spec.duration + 120:
                    raise LoadError(f"locust ran {elapsed:.0f} s for a {spec.duration} s load")
                if on_progress is not None and on_progress(elapsed):
                    os.killpg(proc.pid, signal.SIGTERM)  # locust stops users, writes "stop"
                    proc.wait(timeout=30)
                    break
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode not in (0, -signal.SIGTERM) or not samples.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
        raise LoadError(f"locust exited with {proc.returncode}: " + " | ".join(tail))
    return samples
