"""`python -m tuner profile` and `python -m tuner simulate` (docs/simulator.md)."""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from loadtests.workloads import WORKLOAD_NAMES
from tuner.measure.capacity import SUSTAIN_SECONDS, check_sustain
from tuner.sim.context import (DEFAULT_SIM_DURATION, SIM_WARMUP_REQUESTS, SimContext,
                               engine_threads, load_profile)

SHOWN = ("requests", "completed", "goodput", "slo_attainment", "ttft_p50", "ttft_p90",
         "tpot_p50", "itl_p50", "e2e_p90", "prefix_cache_hit_rate", "host_tier_hit_rate",
         "disk_tier_hit_rate", "server_preemptions",
         "kv_cache_usage_perc_mean", "spec_acceptance_rate", "num_blocks", "steps",
         "sim_wall_s")


def add_parsers(sub) -> None:
    prof = sub.add_parser("profile", help="time the engine's steps on this machine and fit "
                                          "the simulator's step-time profile")
    prof.add_argument("--model", default=None, help="default: the embedded tiny model")
    prof.add_argument("--threads", type=int, default=None,
                      help="engine CPU threads (default: OMP_NUM_THREADS, else one per core)")
    prof.add_argument("--block-sizes", default="16,64", help="block sizes to time (comma list)")
    prof.add_argument("--out", default=None,
                      help="write here (default: the cache, $PAGED_PROFILE_DIR)")
    prof.add_argument("--scale", type=float, default=1.0,
                      help="fewer calibration batches (< 1) or more (> 1)")
    live = prof.add_mutually_exclusive_group()
    live.add_argument("--from-metrics", metavar="URL", default=None,
                      help="refit the step times from a running engine's /metrics, read "
                           "every --interval s for --duration s while it serves")
    live.add_argument("--prometheus", metavar="URL", default=None,
                      help="refit the step times from the last --since s of a Prometheus "
                           "that scrapes the service (--selector)")
    prof.add_argument("--base", default=None, metavar="FILE",
                      help="with --from-metrics/--prometheus: the calibrated profile to refit "
                           "(default: cached for --model and --threads, else calibrated now)")
    prof.add_argument("--selector", default="", help='PromQL matcher, e.g. {job="chat"}')
    prof.add_argument("--since", type=float, default=600.0, help="seconds of history")
    prof.add_argument("--duration", type=float, default=60.0, help="seconds to read")
    prof.add_argument("--interval", type=float, default=5.0, help="seconds per window")

    sim = sub.add_parser("simulate", help="what-if: a workload through the engine's own "
                                          "scheduler in virtual time, capacity included")
    src = sim.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=WORKLOAD_NAMES)
    src.add_argument("--trace", metavar="FILE", help="a trace (python -m tuner trace)")
    sim.add_argument("--model", default=None)
    sim.add_argument("--profile", default=None, metavar="FILE",
                     help="a profile file (default: cached for the model and threads, else "
                          "calibrated now)")
    sim.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="an engine setting the tuner searches (api/paged_api/settings.py "
                          "name), or num_gpu_blocks_override or kv_disk_size; repeatable")
    sim.add_argument("--slo", action="append", default=[], metavar="[KIND.]NAME=SECONDS")
    sim.add_argument("--rate", type=float, default=None,
                     help="also report the figures of one load at this rate (req/s)")
    sim.add_argument("--duration", type=float, default=DEFAULT_SIM_DURATION,
                     help="virtual seconds per simulated load")
    sim.add_argument("--warmup-requests", type=int, default=SIM_WARMUP_REQUESTS, metavar="N",
                     help="requests served before each load's scored window, the workload's "
                          "steady state (0: a cold engine)")
    sim.add_argument("--attainment", type=float, default=0.9)
    sim.add_argument("--sustain", type=float, default=SUSTAIN_SECONDS, metavar="SECONDS",
                     help="how long a passing rate's queue must hold (python -m tuner sweep "
                          "--sustain)")
    sim.add_argument("--acceptance", type=float, default=None,
                     help="every speculative draft accepted at this rate (default: each "
                          "method's drafts and acceptance replayed on the model's replies)")
    sim.add_argument("--target-rate", type=float, default=None,
                     help="print the replicas this rate needs at the capacity")
    sim.add_argument("--users", type=int, default=None)
    sim.add_argument("--length-scale", type=float, default=None)
    sim.add_argument("--seed", type=int, default=0)


def workload_profile(model: str | None) -> dict:
    """The sweep's CPU profile for this model (tuner/arguments.py), so a simulation answers
    for the load a sweep would put on it."""
    from tuner.arguments import CPU_MODEL_PROFILES, TINY_MODELS, TINY_PROFILE

    if model in TINY_MODELS:
        return TINY_PROFILE
    if model in CPU_MODEL_PROFILES:
        import torch
        if not torch.cuda.is_available():
            return CPU_MODEL_PROFILES[model]
    return {}


# engine settings the tuner does not search but a what-if may fix: a pool of so many
# blocks, a disk KV tier of so many GiB (simulated without a directory: tuner/sim/tiers.py)
WHAT_IF_ONLY = ("num_gpu_blocks_override", "kv_disk_size")


def parse_sets(items: list[str]) -> dict:
    """--set NAME=VALUE items: the tuner's settings (one value each) and WHAT_IF_ONLY."""
    from paged_api import settings as engine_settings
    from paged_api.search_space import SpaceError, parse_param

    fixed = {}
    for item in items:
        name, sep, value = item.partition("=")
        if sep and name.strip() in WHAT_IF_ONLY:
            fixed[name.strip()] = engine_settings.parse_text(name.strip(), value.strip(),
                                                             f"--set {name.strip()}")
            continue
        try:
            param = parse_param(name.strip(), value) if sep else None
        except SpaceError as exc:
            raise ValueError(str(exc)) from None
        if param is None or param.choices is None or len(param.choices) != 1:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with one value")
        fixed[param.name] = param.choices[0]
    return fixed


def warmup_requests(args) -> int:
    """--sim-warmup-requests (sweep) or --warmup-requests (simulate), SIM_WARMUP_REQUESTS
    where `args` has neither (a benchmark's own namespace); ValueError below 0."""
    sweep = hasattr(args, "sim_warmup_requests")   # its --warmup-requests: real engines'
    given = getattr(args, "sim_warmup_requests" if sweep else "warmup_requests", None)
    count = SIM_WARMUP_REQUESTS if given is None else given
    if count < 0:
        flag = "--sim-warmup-requests" if sweep else "--warmup-requests"
        raise ValueError(f"{flag} {count}: the simulator's warm-up is a number of requests "
                         ">= 0 (0: a cold engine)")
    return count


def context_for(args, *, fixed: dict, log=lambda s: print(s, file=sys.stderr)) -> SimContext:
    """A SimContext for --workload/--trace, --model and the sweep's CPU profile."""
    from loadtests.workloads import get_workload
    from loadtests.workloads.trace import read_trace
    from tuner.arguments import parse_slos

    prof = workload_profile(args.model)
    trace = read_trace(args.trace) if args.trace else None
    spec = get_workload("trace" if trace else args.workload)
    factor = prof.get("slo_scale", 1.0)
    slos = parse_slos(args.slo, {k: {n: round(v * factor, 9) for n, v in s.items()}
                                 for k, s in spec.slos.items()})
    threads = engine_threads({**fixed, **({"cpu_threads": prof["cpu_threads"]}
                                          if "cpu_threads" in prof else {})})
    profile = load_profile(args.model, threads, path=getattr(args, "profile", None), log=log)
    return SimContext(profile, slos, workload=None if trace else spec, trace=trace,
                      users=args.users or max(1, round(spec.users * prof.get("users_factor", 1))),
                      length_scale=args.length_scale or (1.0 if trace else
                                                         prof.get("length_scale", 1.0)),
                      duration=getattr(args, "sim_duration", None) or args.duration,
                      warmup_requests=warmup_requests(args),
                      seed=args.seed, acceptance=getattr(args, "acceptance", None),
                      attainment=getattr(args, "attainment", 0.9),
                      sustain=getattr(args, "sustain", SUSTAIN_SECONDS), model=args.model)


def sim_settings(model: str | None, fixed: dict) -> dict:
    """The settings a simulated engine starts with: the sweep's CPU profile's memory, then
    --set (a disk tier given a directory name the simulator never opens)."""
    prof = workload_profile(model)
    base = {"cpu_memory_gib": prof["cpu_memory_gib"]} if "cpu_memory_gib" in prof else {}
    disk = {"kv_disk_dir": "(simulated)"} if fixed.get("kv_disk_size") is not None else {}
    return {**base, **fixed, **disk}


def profile_main(parser: argparse.ArgumentParser, args) -> int:
    from tuner.sim.calibrate import cached_path, run_calibration

    threads = args.threads or engine_threads({})
    try:
        sizes = tuple(int(s) for s in args.block_sizes.split(","))
    except ValueError:
        parser.error(f"--block-sizes {args.block_sizes!r}: expected integers such as 16,64")
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.from_metrics or args.prometheus:
        profile = _live(parser, args, threads)
        out = Path(args.out) if args.out else cached_path(profile.identity).with_suffix(
            ".live.json")
    else:
        profile = run_calibration(args.model, threads=threads, block_sizes=sizes,
                                  scale=args.scale)
        out = Path(args.out) if args.out else cached_path(profile.identity)
    profile.save(out)
    coef = ", ".join(f"{k} {v:.3g}" for k, v in profile.fit.coefficients.items())
    print(f"profile of {profile.identity.model} ({profile.identity.hardware}, "
          f"{threads} thread(s), torch {profile.identity.torch}): {profile.num_steps} steps; "
          f"form {profile.fit.form} ({coef} s); held-out median error "
          f"{profile.fit.heldout_error:.1%}; {profile.memory.copies_text()}\nwritten to {out}")
    return 0


def _live(parser: argparse.ArgumentParser, args, threads: int):
    """The calibrated profile of --model with its step times refitted from a live series."""
    from tuner.measure.promql import PrometheusError, PrometheusReader
    from tuner.sim import live_profile as live

    if not (args.interval > 0 and args.duration >= 2 * args.interval and args.since > 0):
        parser.error("--interval must be > 0 and --duration (--since) at least two of them")
    try:
        if args.from_metrics:
            series = live.scrape_series(args.from_metrics, duration=args.duration,
                                        interval=args.interval,
                                        log=lambda s: print(s, file=sys.stderr))
        else:
            end = time.time()
            series = live.prometheus_series(
                PrometheusReader(args.prometheus), args.selector, start=end - args.since,
                end=end, interval=args.interval)
        live.fit_live(series)   # enough busy windows, before a calibration is paid for
        base = load_profile(args.model, threads, path=args.base,
                            log=lambda s: print(s, file=sys.stderr))
        return live.live_profile(base, series)
    except (ValueError, PrometheusError) as exc:
        parser.error(str(exc))


def simulate_main(parser: argparse.ArgumentParser, args) -> int:
    if args.rate is not None and not args.rate > 0:
        parser.error(f"--rate must be > 0 requests/s, got {args.rate}")
    if args.duration <= 0:
        parser.error("--duration must be positive (virtual seconds)")
    if not 0 < args.attainment <= 1:
        parser.error("--attainment must be in (0, 1]")
    try:
        check_sustain(args.sustain)
    except ValueError as exc:
        parser.error(str(exc))
    if args.acceptance is not None and not 0 <= args.acceptance <= 1:
        parser.error("--acceptance must be in [0, 1]")
    try:
        warmup_requests(args)   # before a profile is calibrated
        fixed = parse_sets(args.set)
        ctx = context_for(args, fixed=fixed)
        settings = sim_settings(args.model, fixed)
        if args.rate is not None:
            figures = ctx.run(settings, args.rate).figures
            print(f"at {args.rate:g} req/s for {ctx.duration:g} virtual s, after "
                  f"{ctx.warmup_requests} warm-up requests:")
            for name in SHOWN:
                if name in figures:
                    print(f"  {name:<26} {figures[name]:.4g}")
        result = ctx.capacity(settings)
    except ValueError as exc:
        parser.error(str(exc))
    print(result.line() + f" (simulated, slos {ctx.slos})")
    if args.target_rate:
        replicas = math.ceil(args.target_rate / result.rate) if result.rate else None
        print(f"replicas for {args.target_rate:g} req/s: {replicas or 'none meets the SLOs'}")
    return 0
