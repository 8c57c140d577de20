"""Tuned vs defaults, and Optuna vs an exhaustive grid, on the embedded model (CPU).

    python tuner/search/compare.py [--workloads chat summarize] [--duration 10] [--rounds 3]

For each workload, over one small discrete space:
1. an exhaustive grid (every point once), as vLLM's auto_tune does;
2. Optuna (TPE) with a third of the grid's trials;
each followed by the sweep's confirmation: the engine's defaults (the baseline) and the
sweep's best 2 settings re-measured interleaved for --rounds rounds (tuner.search.confirm).
Prints a table: the defaults' goodput, each sweep's gain over them with its 95 %
interval, the decision, and Optuna's confirmed goodput over the grid's.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadtests.workloads import get_workload  # noqa: E402
from tuner.arguments import TINY_PROFILE  # noqa: E402
from tuner.measure.loadgen import LoadSpec  # noqa: E402
from paged_api.search_space import build_space  # noqa: E402
from tuner.search.sweep import SweepConfig, run_sweep  # noqa: E402
from tuner.search.report import summary  # noqa: E402
from tuner.measure.local import EngineLaunch  # noqa: E402

GRID = ["block_size=16,64", "max_num_seqs=1,4,16,64", "max_num_batched_tokens=256,2048",
        "gpu_memory_utilization=0.9"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["chat", "summarize"])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved confirmation rounds (baseline + best 2)")
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
        results = {}
        for label, sampler, trials in (
                ("grid", optuna.samplers.GridSampler(
                    {p.name: p.grid_values() for p in space}, seed=0), grid_size),
                ("optuna", None, max(2, grid_size // 3))):
            config = SweepConfig(workload=name, slos=slos, primary_latency=spec.primary_latency,
                                 space=space, load=load, launch=launch,
                                 storage=f"sqlite:///{out}/compare.db", study_name=f"{name}-{label}",
                                 out_dir=out / label, trials=trials, remeasure=2,
                                 confirm_rounds=args.rounds, sampler=sampler)
            study = run_sweep(config)
            results[label] = (summary(study), trials, study)
        rows.append((name, results))
    print(f"\n{'workload':<10} {'defaults':>9} {'sweep':>7} {'trials':>6} {'confirmed':>10} "
          f"{'gain [95% CI]':>20}  decision")
    for name, r in rows:
        for label in ("grid", "optuna"):
            s, trials, study = r[label]
            record = study.user_attrs["confirmation"]
            gains = [g for g in record["gains"].values() if g]
            best = max(gains, key=lambda g: g["low"]) if gains else None
            interval = (f"{best['ratio']:.2f} [{best['low']:.2f}, {best['high']:.2f}]"
                        if best else "-")
            print(f"{name:<10} {s['baseline_goodput']:>9.3f} {label:>7} {trials:>6} "
                  f"{s['goodput']:>10.3f} {interval:>20}  {record['decision']['reason']}")
        grid, opt = r["grid"][0]["goodput"], r["optuna"][0]["goodput"]
        print(f"{'':<10} optuna/grid (confirmed goodput): "
              f"{opt / grid if grid else float('nan'):.2f}; candidates: "
              + "; ".join(f"{lbl} {r[lbl][2].user_attrs['confirmation']['arms'][1]['params']}"
                          for lbl in ("grid", "optuna")
                          if len(r[lbl][2].user_attrs["confirmation"]["arms"]) > 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
