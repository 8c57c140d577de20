"""How close is the simulator to the engine? For settings spread over the search space:
the simulated and the real SLO capacity, and TTFT p50/p90 and ITL p50 at one fixed rate,
with the relative error of each, the median error per figure and Kendall's tau between
simulated and real capacity (what the search needs: the ranking), plus the cost of one
simulated capacity against one real one: a cold search to 5 %, and one as the sweep runs it
(from the defaults' simulated capacity, to tuner/search/capacity_search.SIM_REL_TOL).

    python -m benchmarks.bench_sim_fidelity [--workload chat] [--settings 12] [--grid tiers|disk]
        [--rate 4 | --rate-share 0.6] [--duration 8] [--sim-duration S] [--model M]
        [--profile FILE ...] [--pilot] [--serving] [--probe-lead S] [--latency-requests N]
        [--save FILE] [--real-from FILE] [--real-also FILE ...] [--speed] [--cpu-memory-gib G]

The latencies are read at one rate for every setting (--rate), or at a share of each
setting's own real capacity (--rate-share): a rate every setting serves (past capacity
both queues grow and the latencies measure nothing), over a window of at least
--latency-requests arrivals, after the same warm-up as the capacity probes.

Real runs use the sweep's CPU profile for the model (tuner/arguments.py), one engine per
setting; the step-time profile is the cached one (python -m tuner profile), or each
--profile given (a live one: python -m tuner profile --from-metrics), all against the same
real runs. With --pilot the simulator is also set up as the capacity sweep sets it up: a
real capacity search of the engine defaults first (not one of the compared settings),
whose served steps refit the profile ("pilot"), then a light load on that engine that
gives each profile its front-end time (TTFT outside the engine's steps: "+front"). With
--serving the pilot's served steps also give each profile its serving term (what the
server adds per delivered row: "+serving", tuner/sim/live_profile.serving_term).

A ranking can be checked only to the real side's own noise: with --real-also (the real
side of other --save runs of the same settings) the bench also prints how each pair of
real runs ranks the settings against each other (Kendall's tau: the ceiling a simulator
is held to) and each profile's tau against the real runs' geometric mean.

The machine's speed moves while the real runs are made: with --speed, a fixed set of engine
steps is timed in-process before the pilot and before each setting's real runs
(benchmarks/machine_speed.py: their time over the cached profile's price), and each
profile's capacity error and tau are also given against the real capacities read at the
pilot's speed (the speed the pilot-fitted profiles describe). The first profile is also
compared scaled to the pilot's speed ("LABEL@speed", and its serving and front-end
variants): a serving term fitted on a calibration that the machine now runs faster than
prices serving at what is left over, which cannot be below zero.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from scipy.stats import kendalltau

from benchmarks.machine_speed import speed_report
from benchmarks.sim_fidelity_grids import (GRIDS, HIT_RATES, hit_rate_lines, latency_window,
                                          on_disk, real_agreement, real_launch, rel)
from loadtests.workloads import WORKLOAD_NAMES, get_workload
from tuner.measure.capacity import (WARMUP_PROBE, after_lead, interpolated, measure_capacity,
                                    probe_load, rate_load)
from tuner.measure.loadgen import LoadSpec
from tuner.measure.local import EngineLaunch
from tuner.measure.scoring import load_samples, score
from tuner.measure.server_metrics import wait_idle
from tuner.measure.trial import measure
from tuner.sim.cli import workload_profile
from tuner.sim.context import SIM_WARMUP_REQUESTS, SimContext, engine_threads, load_profile
from tuner.sim.live_profile import Totals, live_profile, read_steps, serving_term
from tuner.search import capacity_front
from tuner.search.capacity_profile import scaled
from tuner.search.capacity_search import SIM_GROWTH, SIM_MAX_PROBES, SIM_REL_TOL
from tuner.search.capacity_sweep import LIGHT_SHARE
from tuner.sim.simulate import front_seconds

def cpu_setup(workload: str, model: str | None,
              cpu_memory_gib: float | None = None) -> SimpleNamespace:
    """The sweep's CPU profile for the model (tuner/arguments.py) applied to a workload:
    its spec, scaled SLOs, users and length scale, the engine threads, the settings every
    engine starts with (`base`) and the launch of a real engine with them; `cpu_memory_gib`
    names the memory every engine takes instead of the profile's (or the engine's default)."""
    prof = workload_profile(model)
    if cpu_memory_gib is not None:
        prof = {**prof, "cpu_memory_gib": cpu_memory_gib}
    spec = get_workload(workload)
    base = {"cpu_memory_gib": prof["cpu_memory_gib"]} if "cpu_memory_gib" in prof else {}
    flags = ["--cpu-memory-gib", str(prof["cpu_memory_gib"])] if base else []
    if "cpu_threads" in prof:
        flags += ["--cpu-threads", str(prof["cpu_threads"])]
    return SimpleNamespace(
        spec=spec, slos={k: {n: v * prof.get("slo_scale", 1.0) for n, v in s.items()}
                         for k, s in spec.slos.items()},
        users=max(1, round(spec.users * prof.get("users_factor", 1))),
        scale=prof.get("length_scale", 1.0), base=base,
        threads=engine_threads({"cpu_threads": prof["cpu_threads"]} if "cpu_threads" in prof
                               else {}),
        launch=EngineLaunch(model=model, extra_flags=tuple(flags)))


def pilot_sims(sims: dict, base: dict, launch, load, slos, work: Path, duration: float,
               *, front: bool = True, serving: bool = False, series: list | None = None,
               light: dict | None = None) -> dict:
    """The capacity sweep's set-up (tuner/search/capacity_sweep.py): the defaults' real
    capacity search with their steps read meanwhile; with `front`, then a light load (a
    tenth of the defaults' simulated capacity) on the same engine; -> each profile with the
    front-end time that light load gives it ("LABEL+front") and the live refit of the
    first one with its own ("pilot+front"); with `serving`, each profile with the serving
    term the pilot's steps give it ("LABEL+serving": tuner/sim/live_profile.serving_term);
    with both, each serving profile with its own front-end time too ("LABEL+serving+front":
    the sweep's simulator, which takes the front-end time after the serving term). A saved
    pilot's `series` and `light` load (--real-from) are used as read, without a real run
    (without a saved light load, no front-end time). The series read is appended to
    `series`, the light load's rate and records and the pilot's real capacity put in
    `light`."""
    first = next(iter(sims.values()))
    saved = bool(series)
    light = light if light is not None else {}
    front = front and (not saved or bool(light.get("records")))
    series = series if series is not None else []
    if saved:
        rate = light.get("rate")
    else:
        simulated = interpolated(first.capacity(dict(base), rel_tol=0.05))
        rate = light["rate"] = max(LIGHT_SHARE * simulated, 0.5)

    def watch(url: str):
        stop_reading = read_steps(url, series, max(0.5, duration / 5))

        def stop() -> None:
            if front:
                light["records"] = capacity_front.light_load(
                    url, rate_load(load, rate), slos, work / "light")
            stop_reading()
        return stop
    pilot = None if saved else measure_capacity(
        {}, launch, load, slos, workdir=work, start=simulated / 2, warmup_requests=2,
        rel_tol=0.1, max_probes=7, watch=watch, warmup_load=first.warmup_requests)
    real = f"{interpolated(pilot):.2f}" if pilot else "(saved)"
    if pilot:
        light["pilot_capacity"] = interpolated(pilot)
    if len(series) > 1 and series[-1].steps > series[0].steps:
        a, b = series[0], series[-1]
        print(f"pilot: {b.steps - a.steps:.0f} steps, loop gaps between them "
              f"{(b.gap - a.gap) / (b.steps - a.steps) * 1000:.2f} ms per step "
              f"({(b.gap - a.gap) / max(b.looped - a.looped, 1e-9):.1%} of the loop's time)",
              flush=True)
    out = {}
    if serving:
        for label, sim in sims.items():
            profile, info = serving_term(sim.profile, series)
            out[f"{label}+serving"] = dataclasses.replace(sim, profile=profile)
            print(f"{label}+serving: {info['seconds_per_step'] * 1000:.3f} ms per served step "
                  f"+ {info['seconds_per_row'] * 1000:.3f} ms per served row "
                  f"+ {info['seconds_per_row_squared'] * 1e6:.2f} us per row squared "
                  f"from the pilot's {info['windows']} windows ({info['steps']} steps; their "
                  f"median error {info['error_before']:.1%} -> {info['error_after']:.1%}); "
                  f"defaults' real capacity {real}", flush=True)
    if front:
        fronted = {f"{label}+front": dataclasses.replace(sim)
                   for label, sim in (sims | out).items()}
        fronted["pilot+front"] = dataclasses.replace(
            first, profile=live_profile(first.profile, series))
        for label, sim in fronted.items():
            sim.front_seconds = front_seconds(light["records"],
                                              sim.run(dict(base), rate).samples.records)
            print(f"{label}: front-end time {sim.front_seconds * 1000:.1f} ms (light load at "
                  f"{rate:.2f} req/s; defaults' real capacity {real})",
                  flush=True)
        out |= fronted
    return out


def real_figures(i: int, settings: dict, start: float, args, cpu, load, work: Path) -> dict:
    """One setting's real capacity (its search starting at `start`), then its latencies at
    the fixed rate (--rate, or --rate-share of that capacity) after the same warm-up as
    the simulated run's: real_s, real_cap, rate, real_ttft_p50/p90, real_itl_p50."""
    slos = cpu.slos
    launch, tuned = real_launch(cpu.launch, settings, work / f"disk-{i}-capacity")
    t0 = time.perf_counter()
    real = measure_capacity(tuned, launch, load, slos, workdir=work / f"cap-{i}",
                            start=start, warmup_requests=2, rel_tol=0.1, max_probes=7,
                            warmup_load=args.sim_warmup_requests, lead=args.probe_lead)
    row = {"real_s": time.perf_counter() - t0, "real_cap": interpolated(real)}
    rate = row["rate"] = args.rate if args.rate_share is None else max(
        args.rate_share * row["real_cap"], 0.1)
    seconds = latency_window(load.duration, rate, args.latency_requests)
    fixed_load = dataclasses.replace(rate_load(load, rate), seed=1,
                                     duration=seconds + args.probe_lead)
    launch, tuned = real_launch(cpu.launch, settings, work / f"disk-{i}-fixed")
    engine = launch.process(tuned, work / f"fixed-{i}" / "engine.log")
    engine.start(timeout=launch.startup_timeout)
    try:
        if args.sim_warmup_requests:   # the same steady state as the simulated run's
            warm = rate_load(probe_load(load, WARMUP_PROBE), rate)
            measure(engine.url, dataclasses.replace(
                warm, duration=args.sim_warmup_requests / rate), slos,
                workdir=work / f"fixed-{i}" / "warmup")
            wait_idle(engine.url)
        served = measure(engine.url, fixed_load, slos, workdir=work / f"fixed-{i}",
                         warmup_requests=0 if args.sim_warmup_requests else 2)
    finally:
        engine.stop()
    window = after_lead(load_samples(work / f"fixed-{i}" / "samples.jsonl"), args.probe_lead)
    measured = score(window, slos)
    row.update({f"real_{k}": measured.get(k) for k in ("ttft_p50", "ttft_p90", "itl_p50")})
    row["real_requests"] = sum(1 for r in window.records if r.get("ok"))   # finished
    # the engine's own counters over the load (its lead included): hits by tier
    row.update({f"real_{k}": served.get(k) for k in HIT_RATES})
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="chat", choices=WORKLOAD_NAMES)
    ap.add_argument("--settings", type=int, default=12)
    ap.add_argument("--grid", choices=sorted(GRIDS), default="spread",
                    help="spread: batch limit, page size, budget, memory over the space; "
                         "tiers: small device pools without and with a host KV tier; disk: "
                         "a small host tier without and with a disk tier under it")
    rates = ap.add_mutually_exclusive_group()
    rates.add_argument("--rate", type=float, default=4.0, help="the fixed rate of the latencies")
    rates.add_argument("--rate-share", type=float, default=None, metavar="F",
                       help="the latencies at F x each setting's real capacity instead")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per real load")
    ap.add_argument("--sim-duration", type=float, default=None,
                    help="virtual seconds per simulated load (default: --duration, as the "
                         "sweep)")
    ap.add_argument("--sim-warmup-requests", type=int, default=SIM_WARMUP_REQUESTS)
    ap.add_argument("--latency-requests", type=int, default=40, metavar="N",
                    help="the latencies' window lasts --duration, or N arrivals at its rate "
                         "where that is longer (both sides)")
    ap.add_argument("--probe-lead", type=float, default=0.0, metavar="S",
                    help="each probe, real and simulated, runs S s at its rate before its "
                         "scored window (measure_capacity's and simulate's lead)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--cpu-memory-gib", type=float, default=None, metavar="G",
                    help="the memory every engine takes, both sides (default: the sweep's "
                         "profile for the model, else the engine's 2 GiB); on SmolLM2 the "
                         "grid's 0.5-0.7 fractions of 2 GiB hold no 8k-token sequence")
    ap.add_argument("--profile", action="append", default=[], metavar="FILE",
                    help="a profile to compare (repeatable; default: the cached one)")
    ap.add_argument("--pilot", action="store_true",
                    help="also the sweep's set-up: a pilot of the defaults refits the profile "
                         "and measures the front-end time")
    ap.add_argument("--serving", action="store_true",
                    help="also each profile with the serving term of a pilot of the "
                         "defaults' served steps (without --pilot: no front-end time)")
    ap.add_argument("--save", default=None, metavar="FILE",
                    help="write the rows (real and simulated) and the pilot's series as JSON")
    ap.add_argument("--sim-workers", type=int, default=None, metavar="N",
                    help="also time the whole grid as the sweep searches it over N worker "
                         "processes (tuner/search/sim_pool.py): the cost per setting then")
    ap.add_argument("--real-from", default=None, metavar="FILE",
                    help="the real side from a --save of an earlier run (same settings, "
                         "rates and pilot): simulator variants against one set of real runs")
    ap.add_argument("--real-also", action="append", default=[], metavar="FILE",
                    help="the real capacities of another --save run of the same settings "
                         "(repeatable): the real runs' tau between themselves, and each "
                         "profile's against their geometric mean")
    ap.add_argument("--speed", action="store_true",
                    help="time a fixed set of engine steps before the pilot and each "
                         "setting's real runs, and give the errors at the pilot's speed too")
    args = ap.parse_args(argv)
    others = [json.loads(Path(f).read_text()) for f in args.real_also]
    saved = json.loads(Path(args.real_from).read_text()) if args.real_from else None
    if saved and args.pilot and not saved.get("light"):
        ap.error("--pilot needs a real engine for its light load, and the --real-from run "
                 "saved none; not with --real-from")
    for f, other in zip(args.real_also, others):
        grid = [r["settings"] for r in other["rows"]]
        if grid[:args.settings] != GRIDS[args.grid][:args.settings]:
            ap.error(f"--real-also {f} measured other settings than these {args.settings} "
                     f"(its first: {grid[:1]}); give a run of this grid")
    if args.rate_share is not None and not 0 < args.rate_share <= 1:
        ap.error(f"--rate-share must be in (0, 1], got {args.rate_share}")
    cpu = cpu_setup(args.workload, args.model, args.cpu_memory_gib)
    slos, base, launch = cpu.slos, cpu.base, cpu.launch
    sims = {Path(f).stem if f else "cached": SimContext(
        load_profile(args.model, cpu.threads, path=f), slos, workload=cpu.spec,
        users=cpu.users, length_scale=cpu.scale, duration=args.sim_duration or args.duration,
        model=args.model,
        warmup_requests=args.sim_warmup_requests, lead=args.probe_lead)
        for f in (args.profile or [None])}
    load = LoadSpec(workload=args.workload, duration=args.duration, users=cpu.users,
                    arrival="open", rate=args.rate, length_scale=cpu.scale)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="sim-fidelity-"))
    series = [Totals(**t) for t in saved["pilot_series"]] if saved else []
    light = dict(saved.get("light") or {}) if saved else {}
    speed = None
    if args.speed and not saved:
        from benchmarks.machine_speed import SpeedIndex
        speed = SpeedIndex(next(iter(sims.values())).profile, model=args.model,
                           threads=cpu.threads)
        light["speed"] = speed.measure()
        print(f"machine speed before the pilot: {light['speed']:.3f} of the profile's "
              "step time", flush=True)
    if args.speed and light.get("speed"):   # the first profile at the pilot's speed too
        label, first = next(iter(sims.items()))
        sims[f"{label}@speed"] = scaled(first, light["speed"])
    if args.pilot or args.serving:
        sims |= pilot_sims(sims, base, launch, load, slos, work / "pilot", args.duration,
                           front=args.pilot or bool(light), serving=args.serving,
                           series=series, light=light)
    # the sweep searches each setting from the best capacity so far (first the defaults'
    # simulated one), to SIM_REL_TOL: its cost per setting, beside the precise cold search
    warm = {label: interpolated(sim.capacity(dict(base), rel_tol=SIM_REL_TOL))
            for label, sim in sims.items()}
    for i, settings in enumerate(GRIDS[args.grid][:args.settings]):
        row: dict = {"settings": settings}
        simulated = on_disk(settings, "simulated")   # a VirtualDisk: no directory
        for label, sim in sims.items():
            t0 = time.perf_counter()
            cap_sim = sim.capacity({**base, **simulated}, rel_tol=0.05)
            row[f"{label}_s"] = time.perf_counter() - t0
            row[f"{label}_cap"] = interpolated(cap_sim)
            t0 = time.perf_counter()
            swept = sim.capacity({**base, **simulated}, start=max(warm[label], 0.5),
                                 rel_tol=SIM_REL_TOL, growth=SIM_GROWTH,
                                 max_probes=SIM_MAX_PROBES)
            row[f"{label}_sweep_s"] = time.perf_counter() - t0
            row[f"{label}_sweep_cap"] = interpolated(swept)
        if saved:
            if saved["rows"][i]["settings"] != settings:
                raise SystemExit(f"--real-from {args.real_from}: row {i} holds "
                                 f"{saved['rows'][i]['settings']}, not {settings}")
            row.update({k: v for k, v in saved["rows"][i].items()
                        if k.startswith("real_") or k in ("rate", "speed")})
        else:
            if speed is not None:
                row["speed"] = speed.measure()
            row.update(real_figures(i, settings, max(min(
                row[f"{label}_cap"] for label in sims) / 2, 0.5), args, cpu, load, work))
        rate = row["rate"]
        for label, sim in sims.items():
            fixed = sim.run({**base, **simulated}, rate, duration=latency_window(
                sim.duration, rate, args.latency_requests)).figures
            row.update({f"{label}_{k}": fixed.get(k) for k in ("ttft_p50", "ttft_p90",
                                                                "itl_p50") + HIT_RATES})
        rows.append(row)
        print(f"{i:>2} {settings}: capacity real {row['real_cap']:.2f}, " + ", ".join(
            f"{label} {row[f'{label}_cap']:.2f}" for label in sims)
            + f"; at {rate:.2f} req/s ttft p50 real {row['real_ttft_p50'] or 0:.3f} s, "
            + ", ".join(
            f"{label} {row[f'{label}_ttft_p50'] or 0:.3f}" for label in sims)
            + f" ({row.get('real_requests', '?')} finished); cost real {row['real_s']:.1f} s",
            flush=True)
    for label in sims:
        print(f"\nprofile {label}:\n{'figure':<12} {'median rel. error':>18}")
        for fig in ("cap", "ttft_p50", "ttft_p90", "itl_p50"):
            errs = [e for r in rows
                    if (e := rel(r[f"{label}_{fig}"], r[f"real_{fig}"])) is not None]
            print(f"{fig:<12} {statistics.median(errs):>17.1%}" if errs else f"{fig:<12} -")
        for line in hit_rate_lines(rows, label):
            print(line)
        tau = kendalltau([r[f"{label}_cap"] for r in rows],
                         [r["real_cap"] for r in rows]).statistic
        ratio = statistics.median(r["real_cap"] / r[f"{label}_cap"] for r in rows
                                  if r[f"{label}_cap"])
        speed = statistics.median(r["real_s"] / r[f"{label}_s"] for r in rows)
        swept = statistics.median(r["real_s"] / r[f"{label}_sweep_s"] for r in rows)
        swept_err = statistics.median(rel(r[f"{label}_sweep_cap"], r[f"{label}_cap"])
                                      for r in rows)
        print(f"Kendall tau (capacity, sim vs real): {tau:.2f} over {len(rows)} settings")
        print(f"real / simulated capacity, median: {ratio:.2f}")
        print(f"cost: one real capacity search / one simulated, median: {speed:.1f}x")
        print(f"cost: the same, simulated as the sweep searches (from the defaults' "
              f"{warm[label]:.2f} req/s, to {SIM_REL_TOL:.0%}), median: {swept:.1f}x (its "
              f"capacities {swept_err:.1%} from the precise ones)")
    if light.get("speed") and all(r.get("speed") for r in rows):
        print(speed_report(rows, light, list(sims)))
    if others:
        print(real_agreement(rows, others, list(sims)))
    if args.sim_workers:
        from tuner.search.capacity_search import simulate_point
        from tuner.search.sim_pool import SimPool

        real_s = statistics.median(r["real_s"] for r in rows)
        print(f"\nthe grid as the sweep searches it over {args.sim_workers} workers "
              f"(a real capacity search: median {real_s:.1f} s):")
        for label, sim in sims.items():
            t0 = time.perf_counter()
            plan = SimpleNamespace(sim=sim, sim_base=base)
            with SimPool(plan, args.sim_workers, simulate_point) as pool:
                pool.map([(on_disk(s, "simulated"), max(warm[label], 0.5))
                          for s in GRIDS[args.grid][:args.settings]])
            per = (time.perf_counter() - t0) / len(rows)
            print(f"  {label}: {per:.2f} s a setting, {real_s / per:.1f}x cheaper than real")
    if args.save:
        Path(args.save).write_text(json.dumps({
            "argv": argv, "rows": rows,
            "pilot_series": [dataclasses.asdict(t) for t in series], "light": light},
            indent=1))
        print(f"saved to {args.save}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
