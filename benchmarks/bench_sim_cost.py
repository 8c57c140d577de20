"""What a simulated capacity costs, with probes stopped once decided against probes run
to their end: for settings of the fidelity grid, the capacity search both ways (same
seed, same probes), their capacities (identical by construction: the table shows it),
probes, seconds and the ratio, and the median ratio.

    python -m benchmarks.bench_sim_cost [--workload chat] [--settings 6] [--model M]
        [--duration 60]

The profile is the cached one (python -m tuner profile); CPU time only, no engine runs.
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from benchmarks.sim_fidelity_grids import GRID
from loadtests.workloads import WORKLOAD_NAMES
from tuner.measure.capacity import interpolated
from tuner.sim.cli import context_for, sim_settings
from tuner.sim.context import DEFAULT_SIM_DURATION
from tuner.sim.simulate import sim_capacity


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="chat", choices=WORKLOAD_NAMES)
    ap.add_argument("--settings", type=int, default=6)
    ap.add_argument("--model", default=None)
    ap.add_argument("--duration", type=float, default=DEFAULT_SIM_DURATION)
    args = ap.parse_args(argv)
    ctx = context_for(SimpleNamespace(model=args.model, trace=None, workload=args.workload,
                                      slo=[], users=None, length_scale=None, seed=0,
                                      duration=args.duration), fixed={})
    base = sim_settings(args.model, {})
    ctx.run(base, 1.0)   # tokenizer and model config loaded outside the timings
    print(f"{args.workload}, {args.duration:g} virtual s per probe, profile "
          f"{ctx.profile.identity.model} ({ctx.profile.identity.hardware})\n")
    print("| settings | capacity, full probes | capacity, stopped probes | probes | "
          "full s | stopped s | ratio |\n|---|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for settings in GRID[:args.settings]:
        merged = {**base, **settings}
        t0 = time.perf_counter()
        full = sim_capacity(lambda rate, probe: ctx.run(merged, rate), ctx.slos)
        t1 = time.perf_counter()
        fast = ctx.capacity(merged)
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
        label = ", ".join(f"{k} {v}" for k, v in settings.items())
        print(f"| {label} | {interpolated(full):.2f} | {interpolated(fast):.2f} | "
              f"{len(fast.probes)} | {t1 - t0:.1f} | {t2 - t1:.1f} | {ratios[-1]:.1f}x |",
              flush=True)
    print(f"\nmedian ratio, full / stopped: {statistics.median(ratios):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
