"""Engine request latency on CPU by torch thread count, alone and beside busy neighbours.

    python benchmarks/bench_cpu_threads.py [--rounds 4] [--neighbours 2] [--threads default,1]

Each round starts a fresh `python -m engine serve` (the embedded tiny model) and sends three
waves of two concurrent chat requests sharing a system prompt, as the tuner's chat workload
does. "Neighbours" are other processes running torch matmuls with torch's default threads,
as on a CI machine running tests in parallel or a node shared with other pods. The table
gives the median and the worst request latency per setting, and each median's ratio to the
`--cpu-threads 1` median measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from openai import OpenAI  # noqa: E402

from tuner.measure.engine_process import EngineProcess  # noqa: E402

NEIGHBOUR = "import torch\nx = torch.randn(800, 800)\nwhile True:\n    x = (x @ x).tanh()\n"


def neighbours(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) for _ in range(count)]


def one_round(threads: str, log_path: Path) -> list[float]:
    flags = ["--cpu-memory-gib", "0.5", "--max-num-seqs", "8"]
    if threads != "default":
        flags += ["--cpu-threads", threads]
    engine = EngineProcess(flags=flags, log_path=log_path)
    engine.start(timeout=300)
    try:
        client = OpenAI(base_url=engine.url + "/v1", api_key="unused", timeout=300)
        model = client.models.list().data[0].id
        latencies: list[float] = []

        def ask(i: int) -> None:
            t0 = time.monotonic()
            client.chat.completions.create(model=model, max_tokens=24, temperature=0.0, messages=[
                {"role": "system", "content": "You are a helpful assistant. " * 20},
                {"role": "user", "content": f"question {i} " * (3 + i)}])
            latencies.append(time.monotonic() - t0)

        for wave in range(3):
            workers = [threading.Thread(target=ask, args=(2 * wave + j,)) for j in range(2)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        return latencies
    finally:
        engine.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--neighbours", type=int, default=2, help="busy torch processes beside the engine")
    p.add_argument("--threads", default="default,1", help="comma-separated: 'default' or a number")
    args = p.parse_args()
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "PAGED_CPU_THREADS"):
        os.environ.pop(name, None)  # engines and neighbours get torch's defaults unless told
    settings = args.threads.split(",")
    if "1" not in settings:
        settings.append("1")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-cpu-threads-"))
    results: dict[tuple[int, str], list[float]] = {}
    for count in (0, args.neighbours):
        busy = neighbours(count)
        try:
            for rnd in range(args.rounds):  # settings interleaved, so drift hits each alike
                for threads in settings:
                    lat = one_round(threads, log_dir / f"engine-n{count}-t{threads}-r{rnd}.log")
                    results.setdefault((count, threads), []).extend(lat)
                    print(f"# neighbours {count}, threads {threads}, round {rnd}: "
                          f"{' '.join(f'{x:.2f}' for x in lat)}", flush=True)
        finally:
            for proc in busy:
                proc.kill()
    cores = len(os.sched_getaffinity(0))
    print(f"\n{cores} cores, {args.rounds} rounds x 6 requests per row; engine logs in {log_dir}\n")
    print("| busy neighbours | --cpu-threads | median latency (s) | worst (s) | median / threads-1 median |")
    print("|---:|---|---:|---:|---:|")
    for (count, threads), lat in results.items():
        base = statistics.median(results[(count, "1")])
        med = statistics.median(lat)
        print(f"| {count} | {threads} | {med:.2f} | {max(lat):.2f} | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
