"""`python -m tuner sweep` with --objective capacity: the simulator set up like the sweep's
real engines (same model, threads, CPU memory, workload, SLOs and lengths)."""
from __future__ import annotations

import argparse
from pathlib import Path

from tuner.arguments import DEFAULT_SIM_TRIALS
from tuner.measure.capacity import check_sustain


def objective(args: argparse.Namespace) -> str:
    """The default objective: capacity for this engine (the simulator models it), goodput
    for another server (--engine-cmd) or a running one (--target-url)."""
    if args.objective:
        return args.objective
    return "goodput" if args.engine_cmd or args.target_url else "capacity"


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.engine_cmd:
        parser.error("--objective capacity simulates this engine; with --engine-cmd use "
                     "--objective goodput")
    if args.rate is not None:
        parser.error("--rate: the capacity objective searches the rate itself; drop --rate "
                     "(or use --objective goodput for one fixed rate)")
    if not 0 < args.attainment <= 1:
        parser.error("--attainment must be in (0, 1]")
    try:
        check_sustain(args.sustain)
    except ValueError as exc:
        parser.error(str(exc))
    if args.target_rate is not None and not args.target_rate > 0:
        parser.error("--target-rate must be > 0 requests/s")
    if args.sim_duration is not None and not args.sim_duration > 0:
        parser.error("--sim-duration must be positive (virtual seconds)")
    if args.acceptance is not None and not 0 <= args.acceptance <= 1:
        parser.error("--acceptance must be in [0, 1]")
    if args.sim_workers is not None and args.sim_workers < 1:
        parser.error("--sim-workers must be >= 1 (1: simulate in the sweep's own process)")
    if args.real_probes < 2:
        parser.error("--real-probes must be at least 2: one probe brackets nothing")
    from tuner.sim.cli import warmup_requests
    try:
        warmup_requests(args)
    except ValueError as exc:
        parser.error(str(exc))


def engines_cpu_gib(given: float | None, step_profile) -> float | None:
    """The CPU memory (GiB) the sweep's engines size their KV pools from, which the
    simulated engines and the pilot's pool fit take (capacity_profile.fit_pool): `given`
    (--cpu-memory-gib, else the model's sweep profile), else the engine's own default
    (PAGED_CPU_MEMORY_GIB, else the settings table's), which an engine launched without
    the flag takes. None for a profile calibrated on a GPU: its device is its own
    (Memory.device_bytes). Left unnamed, the fit made up a device that held the
    calibration's activations and the pilot's pool at the baseline's fraction; a served
    engine's activations (read from its resident memory at start) can be far larger, so
    the device came out small and lower fractions kept too many blocks: SmolLM2
    (2026-12-07), pilot 981 blocks of 16 at 0.9; at 0.65 with blocks of 32 and a
    408-token budget the fit said 277 blocks, the engine had 209 and refused to start (a
    max_model_len sequence needs 256); with the engine's 2 GiB named, 164."""
    if given:
        return float(given)
    if step_profile.memory.device_bytes:
        return None
    from paged_api.settings import env_default
    return float(env_default("cpu_memory_gib"))


def sim_duration(given: float | None, real: float) -> float:
    """A simulated load's window: the real loads' (`real`, --duration) unless given. A
    capacity probe's window is short beside the TTFT SLO (chat on a CPU: 10 s against 3 s),
    so a rate past capacity still passes while its queue builds, for longer the shorter the
    window: with the pilot's serving term, 20-s simulated windows against 8-s real ones put
    the embedded model's 12 chat settings at a median real/simulated ratio of 1.13, 8-s
    ones at 1.00 (docs/benchmarks/tuning.md, 2026-12-05)."""
    return given if given is not None else real


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, config, source,
        profile: dict) -> int:
    from loadtests.workloads.trace import read_trace
    from tuner.search.capacity_report import print_and_write
    from tuner.search.capacity_sweep import CapacityPlan, run_capacity_sweep
    from tuner.search.sim_pool import default_workers
    from tuner.sim.cli import warmup_requests
    from tuner.sim.context import SimContext, engine_threads, load_profile

    threads = engine_threads({"cpu_threads": profile["cpu_threads"]}
                             if "cpu_threads" in profile else {})
    try:
        step_profile = load_profile(args.model, threads, path=args.profile)
        trace = read_trace(source.trace) if source.trace else None
    except ValueError as exc:
        parser.error(str(exc))
    cpu_gib = engines_cpu_gib(args.cpu_memory_gib or profile.get("cpu_memory_gib"),
                              step_profile)
    sim = SimContext(step_profile, config.slos, workload=None if trace else source.spec,
                     trace=trace, users=config.load.users,
                     length_scale=config.load.length_scale,
                     duration=sim_duration(args.sim_duration, config.load.duration),
                     seed=args.seed, acceptance=args.acceptance, attainment=args.attainment,
                     sustain=args.sustain, model=args.model, warmup_requests=warmup_requests(args))
    plan = CapacityPlan(sim=sim, sim_base={"cpu_memory_gib": cpu_gib} if cpu_gib else {},
                        trials=args.trials or DEFAULT_SIM_TRIALS,
                        workers=args.sim_workers or default_workers(),
                        real_probes=args.real_probes, target_rate=args.target_rate,
                        trace_rate=source.trace_rate, front=args.front_end_time,
                        pool_from_pilot=True)
    try:
        record = run_capacity_sweep(config, plan)
    except ValueError as exc:
        parser.error(str(exc))
    source.write_document(config.out_dir)
    return print_and_write(record, out=Path(args.out) if args.out else
                           config.out_dir / "best.yaml", out_dir=config.out_dir)
