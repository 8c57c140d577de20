"""The capacity sweep's simulated settings in one process against several (--sim-workers):
the same settings' simulated capacities (the fidelity grid, as the sweep searches each:
from the defaults' simulated capacity, to 10 %, growth 1.5) through tuner/search/
sim_pool.SimPool with each worker count, interleaved over rounds; the wall time per
setting, its median over rounds, the ratio to one process, and whether every worker count
found the same capacities (it must: the simulator is deterministic).

    python -m benchmarks.bench_sim_workers [--workload chat] [--settings 12] [--workers 1,2]
        [--rounds 3] [--model M]

CPU time only, no engine runs; the profile is the cached one (python -m tuner profile).
The machine should be otherwise idle: the point is how the workers share its cores.
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from benchmarks.sim_fidelity_grids import GRID
from loadtests.workloads import WORKLOAD_NAMES
from tuner.search.capacity_search import simulate_point
from tuner.search.sim_pool import SimPool, usable_cpus
from tuner.sim.cli import context_for, sim_settings
from tuner.sim.context import DEFAULT_SIM_DURATION


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="chat", choices=WORKLOAD_NAMES)
    ap.add_argument("--settings", type=int, default=12)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--duration", type=float, default=DEFAULT_SIM_DURATION)
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    ctx = context_for(SimpleNamespace(model=args.model, trace=None, workload=args.workload,
                                      slo=[], users=None, length_scale=None, seed=0,
                                      duration=args.duration), fixed={})
    plan = SimpleNamespace(sim=ctx, sim_base=sim_settings(args.model, {}))
    grid = GRID[:args.settings]
    # the defaults' simulated capacity, the start of every setting (as the sweep's search
    # starts from the best so far); it also renders the sessions the workers inherit
    start = simulate_point(plan, {}, start=1.0).capacity
    print(f"{args.workload}, {len(grid)} settings of the fidelity grid, each from "
          f"{start:.2f} req/s (the defaults' simulated capacity); {usable_cpus()} usable "
          f"CPUs; {args.rounds} rounds\n")
    walls: dict[int, list[float]] = {w: [] for w in counts}
    found: dict[int, list[float]] = {}
    for r in range(args.rounds):
        for w in counts if r % 2 == 0 else counts[::-1]:
            t0 = time.perf_counter()
            with SimPool(plan, w, simulate_point) as pool:
                found[w] = [p.capacity for p in pool.map([(s, start) for s in grid])]
            walls[w].append(time.perf_counter() - t0)
    same = all(found[w] == found[counts[0]] for w in counts)
    print("| workers | wall per round, s | median s | per setting, s | vs 1 process |\n"
          "|---:|---|---:|---:|---:|")
    one = statistics.median(walls[counts[0]])
    for w in counts:
        med = statistics.median(walls[w])
        print(f"| {w} | {', '.join(f'{x:.1f}' for x in walls[w])} | {med:.1f} | "
              f"{med / len(grid):.2f} | {one / med:.2f}x |")
    print(f"\nthe same capacities with every worker count: {'yes' if same else 'NO'} "
          f"(median {statistics.median(found[counts[0]]):.2f} req/s)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
