"""`python -m tuner load-worker`: a Locust worker pod of an in-cluster tuning.

With spec.loadWorkers N > 1 the operator runs N of these pods (a Deployment per tuner pod)
beside the tuner Job, and a Service in front of the Job's pod on the Locust master port.
Every measurement of the tuning is one headless Locust master in the Job's pod
(tuner.measure.loadgen, LoadSpec.master_port); a master's end tells its workers to quit, so this
program runs the Locust worker in a loop: it exits with the master, and the next one
waits for the next master (Locust retries its connection for 5 minutes; the loop starts
another after that too). Restarting in the pod rather than by the kubelet avoids the
container restart back-off between measurements.

The master's address: Kubernetes' `<SERVICE>_SERVICE_HOST`/`_SERVICE_PORT` variables when
the pod has them (the Service is made before the workers), else the Service's DNS name.
The workload's locustfile is the tuning's (--workload); a trace arrives from the master
(loadtests/trace.py), the samples go back to it (loadtests/distributed.py). The target's
API key, when it has one, is read from $TUNER_API_KEY_FILE as the tuner reads it.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuner.measure.lifeline import die_with_parent
from tuner.measure.loadgen import LOADTESTS, REPO_ROOT

MASTER_PORT = 5557   # Locust's own default --master-port
RESTART_DELAY = 1.0


def service_env(service: str) -> str:
    """The prefix of Kubernetes' variables for a Service: my-svc -> MY_SVC."""
    return service.upper().replace("-", "_").replace(".", "_")


def master_address(service: str, environ: dict[str, str] | None = None) -> tuple[str, int]:
    env = os.environ if environ is None else environ
    prefix = service_env(service)
    host = env.get(f"{prefix}_SERVICE_HOST") or service
    port = int(env.get(f"{prefix}_SERVICE_PORT") or MASTER_PORT)
    return host, port


def worker_command(workload: str, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOADTESTS / f"{workload}.py"), "--worker",
            "--master-host", host, "--master-port", str(port), "--loglevel", "WARNING"]


def worker_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    key_file = os.environ.get("TUNER_API_KEY_FILE")
    if key_file and Path(key_file).is_file():
        key = Path(key_file).read_text().strip()
        if key:
            env["PAGED_API_KEY"] = key
    return env


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner load-worker",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--master-service", required=True,
                        help="the Service in front of the Locust master (the tuner's pod)")
    parser.add_argument("--workload", required=True,
                        help="the locustfile: loadtests/<WORKLOAD>.py (trace for workloadFrom)")
    parser.add_argument("--runs", type=int, default=0,
                        help="stop after this many worker runs (0: never; for tests)")
    args = parser.parse_args(argv)
    if not (LOADTESTS / f"{args.workload}.py").is_file():
        parser.error(f"--workload {args.workload!r}: no loadtests/{args.workload}.py")
    host, port = master_address(args.master_service)
    command = worker_command(args.workload, host, port)
    current: list[subprocess.Popen] = []

    def stop(*_: object) -> None:
        for proc in current:
            if proc.poll() is None:
                proc.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    runs = 0
    print(f"load worker: Locust master at {host}:{port}, workload {args.workload}", flush=True)
    while True:
        proc = subprocess.Popen(command, env=worker_env(), stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent())
        current[:] = [proc]
        code = proc.wait()
        runs += 1
        print(f"load worker: run {runs} ended ({code}); waiting for the next master",
              flush=True)
        if args.runs and runs >= args.runs:
            return 0
        time.sleep(RESTART_DELAY)
