"""Running a Locust workload headless as a subprocess.

Locust runs in its own process because importing it monkey-patches the interpreter with
gevent, which must not touch the tuner (threads, SQLAlchemy). The command is

  python -m locust -f loadtests/<workload>.py --headless -u U -r U -t <duration>s
         --host URL --csv <prefix> --only-summary --exit-code-on-error 0 --stop-timeout 0
         --samples-file <file> --seed S --arrival closed|open --rate R --length-scale F
         [--real-eos]

and the raw per-request samples come back through --samples-file (loadtests/common.py).
The trace workload adds --trace-file F --trace-speed S. With `workers` > 1 Locust runs
distributed: this command with --master --expect-workers N, plus N worker processes
(`locust -f ... --worker --master-port P`) whose samples the master merges
(loadtests/distributed.py); the master alone is stopped early (pruning), the workers
follow it. With `master_port` set the workers are pods (tuner.measure.load_worker, made by the
operator): the master listens on $POD_IP:master_port and no worker starts here. Every
Locust process is in its own session and dies with the tuner (tuner.measure.lifeline).
"""
from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuner.measure.lifeline import die_with_parent

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    trace: str | None = None   # the trace workload's file (loadtests/workloads/trace.py)
    trace_speed: float = 1.0   # its arrival times are divided by this
    workers: int = 1           # > 1: Locust's distributed mode, N worker processes
    master_port: int | None = None  # workers > 1 run elsewhere (pods) and connect here
    ignore_eos: bool = True    # False: the model's EOS ends replies (Locust --real-eos)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"load workers must be >= 1, got {self.workers}")
        if self.master_port is not None and self.workers < 2:
            raise ValueError("a Locust master port is for load workers elsewhere: "
                             f"workers must be >= 2, got {self.workers}")
        if (self.workload == "trace") != (self.trace is not None):
            raise ValueError("the trace workload needs a trace file, and only it takes one")
        if self.trace is not None and not self.ignore_eos:
            raise ValueError("the trace workload forces its output lengths (ignore_eos); "
                             "it cannot run with the model's EOS")


def locust_command(spec: LoadSpec, *, url: str, samples: Path, csv_prefix: Path) -> list[str]:
    # a trace replays one share per process: at least one user per worker
    users = str(max(1, spec.users, spec.workers if spec.trace else 1))
    command = [sys.executable, "-m", "locust", "-f", str(LOADTESTS / f"{spec.workload}.py"),
               "--headless", "-u", users, "-r", users, "-t", f"{math.ceil(spec.duration)}s",
               "--host", url, "--csv", str(csv_prefix), "--only-summary",
               "--exit-code-on-error", "0", "--stop-timeout", "0", "--loglevel", "WARNING",
               "--samples-file", str(samples), "--seed", str(spec.seed),
               "--arrival", spec.arrival, "--rate", str(spec.rate),
               "--length-scale", str(spec.length_scale)]
    if spec.model_name:
        command += ["--model-name", spec.model_name]
    if not spec.ignore_eos:
        command += ["--real-eos"]
    if spec.trace is not None:
        command += ["--trace-file", str(Path(spec.trace).resolve()),
                    "--trace-speed", str(spec.trace_speed)]
    return command


def worker_wait(spec: LoadSpec) -> int:
    """Seconds a master waits for its workers: processes start in seconds, pods may be
    starting (or restarting their worker after the previous master) for longer."""
    return 300 if spec.master_port else 60


def distributed_commands(spec: LoadSpec, *, url: str, samples: Path, csv_prefix: Path,
                         port: int) -> tuple[list[str], list[list[str]]]:
    """The master's command and the workers' (Locust's own distributed mode); no worker
    commands when the workers are pods (spec.master_port)."""
    bind = (os.environ.get("POD_IP") or "*") if spec.master_port else "127.0.0.1"
    master = [*locust_command(spec, url=url, samples=samples, csv_prefix=csv_prefix),
              "--master", "--master-bind-host", bind, "--master-bind-port", str(port),
              "--expect-workers", str(spec.workers),
              "--expect-workers-max-wait", str(worker_wait(spec)),
              "--users-total", str(max(1, spec.users))]
    if spec.master_port:
        return master, []
    worker = [sys.executable, "-m", "locust", "-f", master[4], "--worker",
              "--master-host", "127.0.0.1", "--master-port", str(port),
              "--loglevel", "WARNING"]
    return master, [list(worker) for _ in range(spec.workers)]


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
    csv_prefix = workdir / "locust"
    if spec.workers > 1:
        command, worker_commands = distributed_commands(
            spec, url=url, samples=samples, csv_prefix=csv_prefix,
            port=spec.master_port or free_port())
    else:
        command, worker_commands = locust_command(
            spec, url=url, samples=samples, csv_prefix=csv_prefix), []
    workers: list[subprocess.Popen] = []
    start = time.monotonic()
    try:
        for i, worker_command in enumerate(worker_commands):
            with open(workdir / f"locust-worker-{i}.log", "wb") as worker_log:
                workers.append(subprocess.Popen(
                    worker_command, stdout=worker_log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env, cwd=workdir, start_new_session=True,
                    preexec_fn=die_with_parent()))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=workdir,
                                    start_new_session=True, preexec_fn=die_with_parent())
            try:
                _wait(proc, spec, start, on_progress, progress_interval)
            finally:
                _stop(proc, grace=0)
        for worker in workers:  # the master's quit stops them; give them a moment
            _stop(worker, grace=15)
    finally:
        for worker in workers:
            _stop(worker, grace=0)
    if proc.returncode not in (0, -signal.SIGTERM) or not samples.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
        raise LoadError(f"locust exited with {proc.returncode}: " + " | ".join(tail))
    return samples


def _wait(proc: subprocess.Popen, spec: LoadSpec, start: float,
          on_progress: Callable[[float], bool] | None, progress_interval: float) -> None:
    # A distributed master first waits for its workers to connect.
    limit = spec.duration + 120 + (worker_wait(spec) if spec.workers > 1 else 0)
    while True:
        try:
            proc.wait(timeout=progress_interval)
            return
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - start
        if elapsed > limit:
            raise LoadError(f"locust ran {elapsed:.0f} s for a {spec.duration} s load")
        if on_progress is not None and on_progress(elapsed):
            os.killpg(proc.pid, signal.SIGTERM)  # locust stops users, writes "stop"
            proc.wait(timeout=30 + (30 if spec.workers > 1 else 0))
            return


def _stop(proc: subprocess.Popen, *, grace: float) -> None:
    """Wait up to `grace` s for the process to end, then kill its process group."""
    try:
        proc.wait(timeout=grace) if grace else None
    except subprocess.TimeoutExpired:
        pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
