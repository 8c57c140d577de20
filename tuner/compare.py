"""Tuned vs defaults, and Optuna vs an exhaustive grid, on the embedded model (CPU).

    python tuner/compare.py [--workloads chat summarize] [--duration 10] [--repeats 2]

For each workload, over one small discrete space:
1. the engine's defaults, measured --repeats times;
2. an exhaustive grid (every point once; the best 2 re-measured), as vLLM's auto_tune does;
3. Optuna (TPE) with a third of the grid's trials (best 2 re-measured).
Prints a table: goodput of defaults, grid best, Optuna best, and the ratios the issue
targets (tuned/defaults >= 1.3; Optuna/grid >= 0.95 with <= 1/3 of the trials).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.workloads import get_workload  # noqa: E402
from tuner import study as st  # noqa: E402
from tuner.cli import TINY_PROFILE  # noqa: E402
from tuner.loadgen import LoadSpec  # noqa: E402
from tuner.space import build_space  # noqa: E402
from tuner.sweep import SweepConfig, run_sweep  # noqa: E402
from tuner.trial import EngineLaunch, Infeasible, run_trial  # noqa: E402

GRID = ["block_size=16,64", "max_num_seqs=1,4,16,64", "max_num_batched_tokens=256,2048",
        "gpu_memory_utilization=0.9"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["chat", "summarize"])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--users", type=int, default=None,
                        help="closed-loop users (default: the workload's, halved as in the tiny profile)")
    parser.add_argument("--out-dir", default="tuner-out/compare")
    args = parser.parse_args(argv)
    space = build_space(params=GRID)
    grid_size = len(list(itertools.product(*(p.grid_values() for p in space))))
    launch = EngineLaunch(extra_flags=("--cpu-memory-gib", str(TINY_PROFILE["cpu_memory_gib"])))
    rows = []
    for name in args.workloads:
        spec = get_workload(name)
        slos = {k: {n: round(v * TINY_PROFILE["slo_scale"], 9) for n, v in slo.items()}
                for k, slo in spec.slos.items()}
        load = LoadSpec(workload=name, duration=args.duration,
                        users=args.users or max(1, round(spec.users * TINY_PROFILE["users_factor"])),
                        length_scale=TINY_PROFILE["length_scale"])
        out = Path(args.out_dir) / name
        defaults = []
        for i in range(args.repeats):
            try:
                defaults.append(run_trial([], launch, load, slos,
                                          workdir=out / f"defaults-{i}")["goodput"])
            except Infeasible as exc:
                print(f"defaults infeasible: {exc.reason}", file=sys.stderr)
                defaults.append(0.0)
        results = {}
        for label, sampler, trials in (
                ("grid", optuna.samplers.GridSampler(
                    {p.name: p.grid_values() for p in space}, seed=0), grid_size),
                ("optuna", None, max(2, grid_size // 3))):
            config = SweepConfig(workload=name, slos=slos, primary_latency=spec.primary_latency,
                                 space=space, load=load, launch=launch,
                                 storage=f"sqlite:///{out}/compare.db", study_name=f"{name}-{label}",
                                 out_dir=out / label, trials=trials, remeasure=2, sampler=sampler)
            best = st.best_group(run_sweep(config))
            results[label] = (best["goodput"] if best else 0.0, trials, best)
        rows.append((name, statistics.fmean(defaults), results))
    print(f"\n{'workload':<10} {'defaults':>9} {'grid best':>10} {'optuna best':>12} "
          f"{'tuned/def':>10} {'optuna/grid':>12} {'trials':>11}")
    for name, default, r in rows:
        grid, optuna_ = r["grid"][0], r["optuna"][0]
        print(f"{name:<10} {default:>9.3f} {grid:>10.3f} {optuna_:>12.3f} "
              f"{optuna_ / default if default else float('inf'):>10.2f} "
              f"{optuna_ / grid if grid else float('nan'):>12.2f} "
              f"{r['optuna'][1]:>4}/{r['grid'][1]:<6}")
        for label in ("grid", "optuna"):
            print(f"  {label} best: {r[label][2]['params'] if r[label][2] else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
