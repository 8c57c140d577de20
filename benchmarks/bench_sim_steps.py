"""Where does the simulator part from the engine? One setting, one open-loop rate: the real
engine and the simulator serve the same workload after the same warm-up, and the table
puts side by side what their steps computed in the scored window (the engine's own step
counters, paged:engine_step_shape and paged:engine_step_duration_seconds, against the
profiled runner's), what that work cost, and what the requests saw.

    python -m benchmarks.bench_sim_steps --workload rag --model builtin://smollm2-135m-instruct \\
        --set max_num_seqs=16 --set max_num_batched_tokens=256 --rate 4.5 [--duration 40]
        [--warmup-requests 200] [--profile FILE]

Two kinds of gap read differently: the same work at a different cost (the row "profile's
time for the real steps" against the real step seconds: the step-time model), or other
work (prefill tokens, decode rows, steps: the state or the scheduling differ). The real
run uses the sweep's CPU profile for the model (tuner/arguments.py); its warm-up is the
workload's stream under another seed at the same rate, the simulator's the first
requests of its own stream, as in the capacity sweep.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from benchmarks.bench_sim_fidelity import cpu_setup
from engine.step_shape import FIGURES
from loadtests.workloads import WORKLOAD_NAMES
from tuner.measure.capacity import WARMUP_PROBE, probe_load, rate_load
from tuner.measure.loadgen import LoadSpec
from tuner.measure.scoring import load_samples, score
from tuner.measure.server_metrics import wait_idle
from tuner.measure.trial import measure
from tuner.sim.cli import parse_sets
from tuner.sim.context import SIM_WARMUP_REQUESTS, SimContext, load_profile
from tuner.sim.live_profile import scrape, steps_price

REQUEST_FIGURES = ("completed", "attainment", "ttft_p50", "ttft_p90", "itl_p50",
                   "prefix_cache_hit_rate")
# the engine's own histograms over the window (tuner.measure.trial differences /metrics):
# against the client's figures above they say how much of a latency the engine saw; the
# simulated side has no HTTP, so its client figures stand against these too
SERVER_FIGURES = {"server_ttft_p50": "ttft_p50", "server_ttft_p90": "ttft_p90",
                  "server_queue_p50": None, "server_queue_p90": None,
                  "server_itl_p50": "itl_p50"}


def window_steps(before, after) -> dict[str, float]:
    """The engine's step counters over a window: steps, seconds and each shape figure."""
    return {"steps": after.steps - before.steps, "seconds": after.seconds - before.seconds,
            **{k: after.figures[k] - before.figures[k] for k in FIGURES}}


def request_figures(figures: dict, records: list[dict]) -> dict[str, float]:
    done = [r for r in records if r.get("ok")]
    return {"completed": float(len(done)), "attainment": figures.get("slo_attainment"),
            "ttft_p50": figures.get("ttft_p50"), "ttft_p90": figures.get("ttft_p90"),
            "itl_p50": figures.get("itl_p50"),
            "prefix_cache_hit_rate": figures.get("prefix_cache_hit_rate"),
            **{name: figures.get(name) for name in SERVER_FIGURES}}


def table(real: dict, sim: dict, fit) -> str:
    rows = ["steps", "seconds"] + list(FIGURES)
    lines = ["| figure (scored window) | real | simulated | simulated / real |",
             "|---|---:|---:|---:|"]

    def line(name: str, a, b) -> None:
        ratio = f"{b / a:.2f}" if a and b is not None else "-"
        fmt = (lambda v: "-" if v is None else f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}")
        lines.append(f"| {name} | {fmt(a)} | {fmt(b)} | {ratio} |")
    for name in rows:
        line(f"step {name}", real[name], sim[name])
    line("seconds per step", real["seconds"] / max(real["steps"], 1),
         sim["seconds"] / max(sim["steps"], 1))
    line("the real steps at the profile's price (s)", real["seconds"],
         steps_price(fit, real["steps"], {k: real[k] for k in FIGURES}))
    for name in REQUEST_FIGURES:
        line(name, real[name], sim[name])
    for name, twin in SERVER_FIGURES.items():
        line(f"{name} (engine's histogram; simulated: {twin or '-'})", real[name],
             sim[twin] if twin else None)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="chat", choices=WORKLOAD_NAMES)
    ap.add_argument("--model", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine setting (api/paged_api/settings.py names; repeatable)")
    ap.add_argument("--rate", type=float, required=True, help="open-loop arrivals per second")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of the scored window")
    ap.add_argument("--warmup-requests", type=int, default=SIM_WARMUP_REQUESTS)
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="the step-time profile (default: the cached calibration)")
    args = ap.parse_args(argv)
    if not args.rate > 0 or not args.duration > 0 or args.warmup_requests < 0:
        ap.error("--rate and --duration must be > 0, --warmup-requests >= 0")
    settings = parse_sets(args.set)
    cpu = cpu_setup(args.workload, args.model)
    profile = load_profile(args.model, cpu.threads, path=args.profile)
    sim = SimContext(profile, cpu.slos, workload=cpu.spec, users=cpu.users,
                     length_scale=cpu.scale, duration=args.duration, model=args.model,
                     warmup_requests=args.warmup_requests)
    simulated = sim.run({**cpu.base, **settings}, args.rate)
    sim_row = {"steps": simulated.figures["steps"],
               **{name: simulated.figures[f"step_{name}"] for name in ("seconds",) + FIGURES},
               **request_figures(simulated.figures, simulated.samples.records)}
    slos, launch = cpu.slos, cpu.launch
    load = LoadSpec(workload=args.workload, duration=args.duration, users=cpu.users,
                    arrival="open", rate=args.rate, length_scale=cpu.scale)
    work = Path(tempfile.mkdtemp(prefix="sim-steps-"))
    engine = launch.process(settings, work / "engine.log")
    engine.start(timeout=launch.startup_timeout)
    try:
        if args.warmup_requests:
            warm = rate_load(probe_load(load, WARMUP_PROBE), args.rate)
            measure(engine.url, dataclasses.replace(
                warm, duration=args.warmup_requests / args.rate), slos,
                workdir=work / "warmup", warmup_requests=2)
            wait_idle(engine.url)
        before = scrape(engine.url)
        figures = measure(engine.url, load, slos, workdir=work / "window", warmup_requests=0)
        after = scrape(engine.url)
    finally:
        engine.stop()
    samples = load_samples(work / "window" / "samples.jsonl")
    real_row = {**window_steps(before, after),
                **request_figures({**score(samples, slos), **figures}, samples.records)}
    label = ", ".join(f"{k} {v}" for k, v in settings.items()) or "engine defaults"
    print(f"\n{args.workload} on {args.model or 'the embedded model'}, {label}; "
          f"{args.rate:g} req/s for {args.duration:g} s after {args.warmup_requests} "
          f"warm-up requests; profile {profile.fit.form} "
          f"(held-out error {profile.fit.heldout_error:.1%})\n")
    print(table(real_row, sim_row, profile.fit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
