"""What one simulated capacity search costs, this checkout against another (a change's
before and after): each workload's searches for a few settings, cold (from the
simulator's start rate), in a fresh process per tree and round, the trees interleaved
round by round so that the machine's drift falls on both.

    git worktree add /tmp/before HEAD~2
    python -m benchmarks.bench_sim_speed --against /tmp/before [--workloads chat,rag]
        [--rounds 2] [--repeats 2] [--settings 3]

Prints per workload and tree the seconds of the searches (the median of --repeats per
setting, summed over the settings) in each round, and the ratio before / after. Imports
and the first search (the tokenizer, the engine's modules) are outside the timing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = ({"max_num_seqs": 64}, {"max_num_seqs": 8}, {"max_num_seqs": 256, "block_size": 64})


def child(workload: str, repeats: int, count: int) -> dict:
    """In the tree on sys.path: the summed median seconds of the first `count` SETTINGS'
    searches and their capacities."""
    from tuner.arguments import build_parser
    from tuner.sim import cli

    args = build_parser(more=(cli.add_parsers,)).parse_args(
        ["simulate", "--workload", workload])
    ctx = cli.context_for(args, fixed={}, log=lambda s: None)
    ctx.capacity(cli.sim_settings(args.model, {"max_num_seqs": 4}))   # warm
    seconds, capacities = 0.0, []
    for fixed in SETTINGS[:count]:
        settings, times = cli.sim_settings(args.model, fixed), []
        for _ in range(repeats):
            started = time.perf_counter()
            result = ctx.capacity(settings)
            times.append(time.perf_counter() - started)
        seconds += statistics.median(times)
        capacities.append(round(result.rate, 3))
    return {"seconds": seconds, "capacities": capacities}


def run_in(tree: Path, workload: str, repeats: int, count: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    # this file run as a script: its child imports the simulator from `tree` alone (the
    # other checkout need not have this benchmark)
    out = subprocess.run([sys.executable, __file__, "--child", workload,
                          "--repeats", str(repeats), "--settings", str(count)],
                         cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", help="the other checkout (a git worktree)")
    ap.add_argument("--workloads", default="chat,summarize,rag,code")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--settings", type=int, default=len(SETTINGS),
                    help=f"the first N of {len(SETTINGS)} settings")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.repeats, args.settings)))
        return 0
    if not args.against or not (Path(args.against) / "tuner").is_dir():
        ap.error("--against must name another checkout of this repository")
    if args.rounds < 1 or args.repeats < 1 or not 1 <= args.settings <= len(SETTINGS):
        ap.error(f"--rounds and --repeats must be at least 1, --settings 1 to {len(SETTINGS)}")
    trees = {"before": Path(args.against).resolve(),
             "after": Path(__file__).resolve().parents[1]}
    print("| workload | round | before, s | after, s | before / after | capacities before; after |")
    print("|---|---:|---:|---:|---:|---|")
    for workload in args.workloads.split(","):
        for r in range(1, args.rounds + 1):
            got = {name: run_in(tree, workload, args.repeats, args.settings)
                   for name, tree in trees.items()}
            b, a = got["before"], got["after"]
            print(f"| {workload} | {r} | {b['seconds']:.2f} | {a['seconds']:.2f} | "
                  f"{b['seconds'] / a['seconds']:.2f}x | {b['capacities']}; "
                  f"{a['capacities']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
