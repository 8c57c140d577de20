"""The SLO planner against the HPA and the oracle, on one traffic script (issue 38).

    python -m benchmarks.bench_planner [--workload chat] [--startup 20] [--slowdown 1.25]
        [--interval 15] [--stabilization 60] [--forecast none] [--plot planner.png]

A fleet of replicas in virtual time (tuner/sim/fleet.py: each replica the engine's own
scheduler on the step-time profile of the model, the router's least-loaded choice and
cold-start hold, start-up and drain) replays one script, in units of one replica's true
capacity C: 0.6 C, a 4x step to 2.4 C, a slow ramp to 3.6 C, a 20-s burst at 5.4 C, 1.6 C,
an idle gap long enough for the idle window, then 0.6 C again (from zero). (Not whole
multiples of C: at exactly k C on k replicas each runs at its knee, the highest rate that
passes a capacity probe, where a queue builds for as long as the rate lasts.) The same seeded
requests at the same times go to every arm (planner_arms.py): the planner, the HPA on
queue depth, the oracle (replicas started a start-up before the rate needs them) and the
reactive oracle (the exact rate, no foresight: the bound for any scaler that reacts). The fleet's engines run `--slowdown` x slower than the
planner's profile says (a service slower than its calibration: the planner's
correction has to find it); C is measured on the fleet's own engine.

Per arm: SLO attainment over every request (a failed one misses), seconds of the script
in violation (10-s windows by arrival below the target attainment), replica-seconds
(from each replica's start to its leaving, start-up and drain included) and their ratio
to the oracle's, requests failed, and the TTFT of the first request after the idle gap
(the cold start). What this is not: real engine processes on the local cluster (this
machine's two cores cannot host replicas whose capacities add up); it is the engine's
scheduler and the planner's own code in one virtual time.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

from benchmarks.planner_arms import HpaArm, OracleArm, PlannerArm, SimPrediction
from loadtests.workloads import WORKLOAD_NAMES
from tuner.measure.scoring import meets_slo
from tuner.planner.core import PlannerSpec
from tuner.sim.cli import context_for
from tuner.sim.fleet import HOLD_LIMIT, Fleet, Script, violation_seconds


def script_points(c: float, idle: float) -> list[tuple[float, float]]:
    return [(0, 0.6 * c), (90, 0.6 * c), (90, 2.4 * c), (240, 2.4 * c), (480, 3.6 * c),
            (480, 5.4 * c), (500, 5.4 * c), (500, 1.6 * c), (600, 1.6 * c), (600, 0.0),
            (600 + idle, 0.0), (600 + idle, 0.6 * c), (720 + idle, 0.6 * c)]


def phases(idle: float) -> list[tuple[str, float, float]]:
    """The script's phases by arrival time (name, from, to), as script_points lays them."""
    return [("0.6 C", 0, 90), ("step to 2.4 C", 90, 240), ("ramp to 3.6 C", 240, 480),
            ("burst 5.4 C", 480, 500), ("1.6 C", 500, 600),
            ("0.6 C from zero", 600 + idle, 720 + idle)]


def slowed(profile, factor: float):
    fit = dataclasses.replace(profile.fit, coefficients={
        k: v * factor for k, v in profile.fit.coefficients.items()})
    return dataclasses.replace(profile, fit=fit)


class DepthProbe:
    """One replica at a constant rate: its queue depth sampled every second."""
    period = 1.0

    def __init__(self) -> None:
        self.depths: list[int] = []

    def __call__(self, fleet, at: float) -> int:
        self.depths += fleet.queue_depths()
        return 1


def summarize(name: str, fleet: Fleet, slos: dict, target: float, idle_end: float) -> dict:
    records = fleet.records
    met = [meets_slo(r, slos.get(r["kind"], {})) for r in records]
    after_idle = [r for r in records if r["start"] >= idle_end]
    by_phase = {}
    for phase, begin, end in phases(idle_end - 600):
        inside = [m for r, m in zip(records, met) if begin <= r["start"] < end]
        by_phase[phase] = sum(inside) / len(inside) if inside else None
    failed = collections.Counter(str(r.get("error")) for r in records if not r.get("ok"))
    return {"arm": name, "requests": len(records),
            "attainment": sum(met) / max(1, len(records)),
            "violation_s": violation_seconds(records, slos, target=target,
                                             end=fleet.script.end),
            "replica_s": fleet.replica_seconds(),
            "failed": sum(not r.get("ok") for r in records),
            "failed_by": dict(failed.most_common()), "by_phase": by_phase,
            "max_replicas": max((d for _, d in fleet.decisions), default=0),
            "cold_ttft": after_idle[0].get("ttft") if after_idle else None}


def attainment_windows(records: list[dict], slos: dict, width: float = 10.0
                       ) -> tuple[list[float], list[float]]:
    """(window midpoints, the share of the requests that arrived in each window and met
    their SLOs), `width` s windows from the first arrival's to the last's; a window with no
    arrival (the idle phase) is NaN, so the plotted line breaks there instead of drawing a
    straight line across it."""
    bins: dict[int, list[bool]] = {}
    for r in records:
        bins.setdefault(int(r["start"] // width), []).append(
            meets_slo(r, slos.get(r["kind"], {})))
    if not bins:
        return [], []
    keys = range(min(bins), max(bins) + 1)
    return ([width * k + width / 2 for k in keys],
            [sum(bins[k]) / len(bins[k]) if k in bins else math.nan for k in keys])


def plot(fleets: dict, slos: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    for name, fleet in fleets.items():
        t = [p[0] for p in fleet.timeline]
        axes[1].step(t, [p[2] for p in fleet.timeline], where="post", label=name)
        axes[2].plot(*attainment_windows(fleet.records, slos), label=name)
    first = next(iter(fleets.values()))
    axes[0].plot([p[0] for p in first.timeline], [p[1] for p in first.timeline], "k")
    axes[0].set_ylabel("arrival rate, req/s")
    axes[1].set_ylabel("replicas")
    axes[2].set_ylabel("SLO attainment\n(10-s windows)")
    axes[2].set_xlabel("virtual seconds")
    axes[1].legend(), axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def make_arm(name: str, makers: dict):
    """An arm by name, optionally `@U`: a planner arm plans each replica at U of its SLO
    capacity (targetUtilization; `planner-holt-lead@0.6`), an oracle arm sizes the fleet
    at U of the true capacity (`oracle@0.8`: ceil(rate / (0.8 C)))."""
    base, _, share = name.partition("@")
    if base not in makers or (share and base == "hpa"):
        raise SystemExit(f"--arms: unknown arm {name!r}; expected one of {sorted(makers)}, "
                         "a planner or oracle arm optionally with @utilisation")
    arm = makers[base]()
    if share and base.startswith("planner"):
        spec = dataclasses.replace(arm.planner.spec, utilisation=float(share))
        arm = PlannerArm(spec, arm.predict)
    elif share:
        arm.capacity *= float(share)
    return arm


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=WORKLOAD_NAMES, default="chat")
    p.add_argument("--model", default=None)
    p.add_argument("--startup", type=float, default=20.0, help="a replica's cold start, s")
    p.add_argument("--slowdown", type=float, default=1.25)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--stabilization", type=float, default=60.0,
                   help="scale-down stabilisation, s (planner and HPA alike)")
    p.add_argument("--idle-window", type=float, default=120.0)
    p.add_argument("--forecast", default="none")
    p.add_argument("--max-replicas", type=int, default=8)
    p.add_argument("--attainment", type=float, default=0.9)
    p.add_argument("--hold-limit", type=int, default=HOLD_LIMIT,
                   help="requests the router holds at zero replicas (--cold-start-queue)")
    p.add_argument("--arms", default="oracle,planner,hpa",
                   help="of oracle, oracle-reactive (no foresight), planner, planner-holt "
                   "(forecast holt), planner-holt-lead (holt past the start-up: "
                   "startupSeconds = --startup), hpa; a planner arm with @U is planned at "
                   "U of a replica's capacity (targetUtilization, e.g. planner-holt-lead@0.6), "
                   "an oracle arm sized at U of it (oracle@0.8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    ns = argparse.Namespace(workload=args.workload, model=args.model, trace=None, slo=[],
                            users=None, length_scale=None, duration=60.0, seed=args.seed,
                            profile=None, attainment=args.attainment)
    ctx = dataclasses.replace(context_for(ns, fixed={}), attainment=args.attainment)
    settings: dict = {}
    _, hf_config = ctx._model_parts()
    true_ctx = dataclasses.replace(ctx, profile=slowed(ctx.profile, args.slowdown),
                                   _loaded=ctx._loaded)
    wall = time.perf_counter()
    capacity = true_ctx.capacity(settings).rate
    predict = SimPrediction(ctx, settings)
    probe = DepthProbe()
    Fleet(true_ctx.profile, settings, ctx.stream(1.0), Script([(0, capacity), (120, capacity)]),
          hf_config=hf_config, startup=args.startup, seed=args.seed).run(probe)
    depth = statistics.fmean(probe.depths[30:]) if len(probe.depths) > 30 else 0.0
    idle = args.idle_window + 3 * args.interval + args.stabilization + 60
    script = Script(script_points(capacity, idle))
    print(f"# {args.workload} on {ctx.model or 'the default model'}: true capacity "
          f"{capacity:.3g} req/s per replica (the planner's profile predicts "
          f"{predict.capacity:.3g}; slowdown {args.slowdown}); HPA target queue depth "
          f"{max(0.1, depth):.3g}; start-up {args.startup:g} s; interval {args.interval:g} s, "
          f"stabilisation {args.stabilization:g} s, idle window {args.idle_window:g} s, "
          f"forecast {args.forecast}; hold {args.hold_limit} requests; script "
          f"{script.end:g} s (set-up "
          f"{time.perf_counter() - wall:.0f} s wall)")
    spec = PlannerSpec(min_replicas=0, max_replicas=args.max_replicas,
                       target_attainment=args.attainment, interval=args.interval,
                       scale_down_stabilization=args.stabilization,
                       idle_window=args.idle_window, forecast=args.forecast)
    holt = dataclasses.replace(spec, forecast="holt")
    lead = dataclasses.replace(holt, startup=args.startup)
    makers = {"oracle": lambda: OracleArm(script, capacity, args.startup, args.max_replicas),
              "oracle-reactive": lambda: OracleArm(script, capacity, args.startup,
                                                   args.max_replicas, foresight=False),
              "planner": lambda: PlannerArm(spec, predict),
              "planner-holt": lambda: PlannerArm(holt, predict),
              "planner-holt-lead": lambda: PlannerArm(lead, predict),
              "hpa": lambda: HpaArm(depth, max_replicas=args.max_replicas,
                                    stabilization=args.stabilization)}
    rows, fleets = [], {}
    for name in args.arms.split(","):
        wall = time.perf_counter()
        fleet = Fleet(true_ctx.profile, settings, ctx.stream(1.0), script,
                      hf_config=hf_config, startup=args.startup, seed=args.seed,
                      initial=1, hold_limit=args.hold_limit).run(make_arm(name, makers))
        fleets[name] = fleet
        rows.append({**summarize(name, fleet, ctx.slos, args.attainment, 600 + idle),
                     "wall_s": time.perf_counter() - wall})
    oracle = next((r["replica_s"] for r in rows if r["arm"] == "oracle"), None)
    print("| arm | requests | SLO attainment | seconds in violation | replica-seconds | "
          "vs oracle | failed | most replicas | cold-start TTFT s | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['replica_s'] / oracle:.2f}x" if oracle else "–"
        cold = f"{r['cold_ttft']:.2f}" if r["cold_ttft"] is not None else "–"
        print(f"| {r['arm']} | {r['requests']} | {r['attainment']:.3f} | "
              f"{r['violation_s']:.0f} | {r['replica_s']:.0f} | {ratio} | {r['failed']} | "
              f"{r['max_replicas']} | {cold} | {r['wall_s']:.0f} |")
    names = [name for name, _, _ in phases(idle)]
    print("\n| arm | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for r in rows:
        print(f"| {r['arm']} | " + " | ".join(
            "–" if r["by_phase"][n] is None else f"{r['by_phase'][n]:.3f}" for n in names)
            + " |")
    for r in rows:
        if r["failed_by"]:
            print(f"# {r['arm']}: failed " + "; ".join(
                f"{count} {why}" for why, count in r["failed_by"].items()))
    if args.plot:
        plot(fleets, ctx.slos, args.plot)
        print(f"# plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
