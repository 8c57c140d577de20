"""Where one Locust process saturates, and what distributed workers add.

Closed-loop `chat` load (many users, no think time) against the fake OpenAI server
(tests/loadtests/fake_openai_server.py: ttft and inter-token gap ~0, so the client is
the bottleneck) for 1, then 2 Locust workers (`tuner.measure.loadgen`, Locust's distributed mode
for 2), reading requests/s and streamed tokens/s from the merged samples, next to the
requests the server counted, and the CPU each side used (cores busy over the run: the
Locust processes from their rusage, the server from this process's). A Locust process near
1.0 core is saturated; the server near 1.0 is the limit instead. Usage: python
benchmarks/bench_locust_workers.py [--duration 10] [--users 64] [--workers 1 2]. The fake
server runs in this process (one thread); on a machine with few cores it competes with
Locust for them, so read the ratio and the CPU columns, not the peak.
"""
from __future__ import annotations

import argparse
import os
import resource
import time
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "loadtests")]

from fake_openai_server import FakeOpenAIServer  # noqa: E402
from tuner.measure.loadgen import LoadSpec, run_load  # noqa: E402
from tuner.measure.scoring import load_samples, score  # noqa: E402


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--length-scale", type=float, default=0.5)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"{args.users} closed-loop users, {args.duration:.0f} s per run")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in args.workers:
            with FakeOpenAIServer(ttft=0.0, itl=0.0) as server:
                spec = LoadSpec(workload="chat", duration=args.duration, users=args.users,
                                length_scale=args.length_scale, workers=workers)
                kids, own = cpu(resource.RUSAGE_CHILDREN), cpu(resource.RUSAGE_SELF)
                start = time.monotonic()
                path = run_load(spec, url=server.url, workdir=Path(tmp) / f"w{workers}")
                wall = time.monotonic() - start   # the run, workers' connection included
                served = len(server.requests)
                locust_cores = (cpu(resource.RUSAGE_CHILDREN) - kids) / wall
                server_cores = (cpu(resource.RUSAGE_SELF) - own) / wall
            samples = load_samples(path)
            figures = score(samples, {})
            rows.append((workers, figures["throughput"], figures["output_tokens_per_s"],
                         len(samples.records), served, locust_cores, server_cores))
    base = rows[0][1] or 1.0
    print("| Locust processes | requests/s | streamed tokens/s | samples | served | vs 1 "
          "| Locust CPU (cores) | server CPU (cores) |")
    print("|---|---|---|---|---|---|---|---|")
    for workers, rps, tps, records, served, lc, sc in rows:
        name = "1 (local)" if workers == 1 else f"{workers} workers + master"
        print(f"| {name} | {rps:.0f} | {tps:.0f} | {records} | {served} | {rps / base:.2f}x "
              f"| {lc:.2f} | {sc:.2f} |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
