"""`python -m tuner sweep|report|trace|profile|simulate` (see tuner/README.md); `tune`
and `load-worker` are the in-cluster tuning's Job and load-worker pods, `plan` a
service's SLO planner pod."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import httpx

from tuner.arguments import (CPU_MODEL_PROFILES, DEFAULT_TRIALS, TINY_MODELS, TINY_PROFILE,
                       build_parser, parse_slos)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tune"]:  # the PagedInferenceTuning Job's program (tuner/incluster/job.py)
        from tuner.incluster import job as cluster
        return cluster.main(argv[1:])
    if argv[:1] == ["load-worker"]:  # a load-worker pod of a tuning (tuner/measure/load_worker.py)
        from tuner.measure import load_worker
        return load_worker.main(argv[1:])
    if argv[:1] == ["plan"]:  # a service's SLO planner pod (spec.autoscaling.mode slo)
        from tuner.planner import run as planner
        return planner.main(argv[1:])
    from tuner.sim.cli import add_parsers as add_sim_parsers

    parser = build_parser(more=(add_sim_parsers,))
    args = parser.parse_args(argv)
    if args.command == "report":
        return _report(parser, args)
    if args.command in ("profile", "simulate"):  # tuner/sim/: the engine in virtual time
        from tuner.sim import cli as sim_cli
        main_of = sim_cli.profile_main if args.command == "profile" else sim_cli.simulate_main
        return main_of(parser, args)
    if args.command == "trace":
        from tuner.sources import log_to_trace as trace
        return trace.main(args)
    return _sweep(parser, args)


def _check_common(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.trials is not None and args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.duration <= 0:
        parser.error("--duration must be positive (seconds)")
    if args.users is not None and args.users < 1:
        parser.error("--users must be at least 1")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive (requests/s)")
    if args.length_scale is not None and args.length_scale <= 0:
        parser.error("--length-scale must be positive")
    if args.remeasure < 0:
        parser.error("--remeasure must be 0 or more")
    if args.confirm_rounds == 1 or args.confirm_rounds < 0:
        parser.error("--confirm-rounds must be 0 (no confirmation) or at least 2: one round "
                     "gives no interval")
    if args.prometheus:
        try:
            httpx.get(args.prometheus.rstrip("/") + "/api/v1/query",
                      params={"query": "1"}, timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            parser.error(f"--prometheus {args.prometheus} does not answer PromQL "
                         f"({type(exc).__name__}: {exc}); start it or fix the URL")


def _profile(args: argparse.Namespace) -> tuple[str, dict]:
    """The CPU profile (tuner/arguments.py) of the engine this sweep starts, or ("", {})."""
    if args.target_url is not None or args.engine_cmd is not None:
        return "", {}
    if args.model in TINY_MODELS:
        return "embedded tiny model", TINY_PROFILE
    if args.model in CPU_MODEL_PROFILES:
        import torch  # the engine's own rule (engine/model_runner.py): CUDA when it is there
        if not torch.cuda.is_available():
            return f"{args.model} on CPU", CPU_MODEL_PROFILES[args.model]
    return "", {}


def _slos_and_load(parser: argparse.ArgumentParser, args: argparse.Namespace, source):
    """The SLOs and the LoadSpec of a sweep: the workload's, the CPU profile's scaling
    (tuner/arguments.py), then the command line's overrides; plus the profile applied."""
    from tuner.measure.loadgen import LoadSpec

    workload = source.spec
    label, profile = _profile(args)
    if profile:
        print(f"profile: {label} ({'; '.join(f'{k} {v}' for k, v in profile.items())}; "
              "tuner/README.md)")
    factor = profile.get("slo_scale", 1.0)
    defaults = {kind: {name: round(limit * factor, 9) for name, limit in slo.items()}
                for kind, slo in workload.slos.items()}
    try:
        slos = parse_slos(args.slo, defaults)
    except ValueError as exc:
        parser.error(str(exc))
    users = max(1, round(workload.users * profile.get("users_factor", 1)))
    scale = args.length_scale or (profile.get("length_scale", 1.0) if source.trace is None
                                  else 1.0)  # a trace's lengths are the service's own
    # The model's EOS ends replies for a real model; the tiny random one's EOS is noise, a
    # trace forces its lengths and a --target-url's model is unknown: ignore_eos there.
    auto_ignore = (source.trace is not None or args.model in TINY_MODELS
                   or args.target_url is not None)
    ignore_eos = {"model": False, "ignore": True}.get(args.eos, auto_ignore)
    if source.trace is not None and not ignore_eos:
        parser.error("--eos model: a trace forces its output lengths (ignore_eos); drop --eos")
    load = LoadSpec(workload=args.workload, duration=args.duration,
                    users=args.users or (1 if args.rate else users),
                    arrival="open" if args.rate else "closed", rate=args.rate or 1.0,
                    seed=args.seed, length_scale=scale, workers=args.load_workers,
                    trace=str(source.trace) if source.trace else None, ignore_eos=ignore_eos)
    return slos, source.load(load), profile


def _engine_flags(args: argparse.Namespace, profile: dict) -> tuple[str, ...]:
    """--engine-arg, then the CPU memory and threads of the profile unless given."""
    extra = list(args.engine_arg)
    cpu_gib = args.cpu_memory_gib or profile.get("cpu_memory_gib")
    if cpu_gib is not None:
        extra += ["--cpu-memory-gib", str(cpu_gib)]
    if "cpu_threads" in profile and not any(a.startswith("--cpu-threads") for a in extra):
        extra += ["--cpu-threads", str(profile["cpu_threads"])]
    return tuple(extra)


def _sweep(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from paged_api.search_space import SpaceError, build_space, parse_param

    from tuner.sources import workload_source
    from tuner.measure.loadgen import LoadError

    from tuner.search import capacity_cli

    _check_common(parser, args)
    args.objective = capacity_cli.objective(args)
    if args.objective == "capacity":
        capacity_cli.check(parser, args)
    if args.load_workers < 1:
        parser.error("--load-workers must be at least 1")
    if args.capacity < 0:
        parser.error("--capacity takes a number of probes >= 1")
    tag = Path(args.model).name if args.model else "default"
    try:  # --workload, --trace or --workload-from-prometheus (tuner/sources/workload_source.py)
        source = workload_source.resolve(args, out_dir=Path(args.out_dir or Path("tuner-out") / (
            args.study_name or f"trace-{args.objective}-{tag}")))
    except (ValueError, LoadError) as exc:
        parser.error(str(exc))
    args.workload, workload = source.name, source.spec
    if source.document:
        print(source.document)
    slos, load, profile = _slos_and_load(parser, args, source)
    if args.target_url:
        return _bench_target(parser, args, load, slos)
    try:
        profile_space = profile.get("space", []) if not args.space_file else []
        space = build_space(params=[*profile_space, *args.param], space_file=args.space_file,
                            wide_block_sizes=args.wide_block_sizes, also=workload.tune_also)
        fixed = {}
        for item in args.set:
            name, sep, value = item.partition("=")
            param = parse_param(name.strip(), value) if sep else None
            if param is None or param.choices is None or len(param.choices) != 1:
                raise SpaceError(f"--set {item!r}: expected NAME=VALUE with one value")
            fixed[param.name] = param.choices[0]
    except SpaceError as exc:
        parser.error(str(exc))
    from tuner.search.confirm import load_baseline
    from tuner.measure.promql import PrometheusReader
    from tuner.search.sweep import SweepConfig, run_sweep
    from tuner.measure.local import EngineLaunch

    try:
        baseline = load_baseline(args.baseline, fixed=fixed, searched=[p.name for p in space])
    except ValueError as exc:
        parser.error(str(exc))
    prometheus = (PrometheusReader(args.prometheus, selector=args.prometheus_selector)
                  if args.prometheus else None)

    model_tag = Path(args.model).name if args.model else "default"
    study_name = args.study_name or f"{args.workload}-{args.objective}-{model_tag}"
    out_dir = Path(args.out_dir or Path("tuner-out") / study_name)
    launch = EngineLaunch(model=args.model, extra_flags=_engine_flags(args, profile),
                          startup_timeout=args.startup_timeout,
                          prometheus_targets_dir=(Path(args.prometheus_targets_dir)
                                                  if args.prometheus_targets_dir else None),
                          **({"engine_cmd": args.engine_cmd} if args.engine_cmd else {}))
    config = SweepConfig(workload=args.workload, slos=slos,
                         primary_latency=workload.primary_latency, space=space, load=load,
                         launch=launch, storage=args.storage, study_name=study_name,
                         out_dir=out_dir, trials=args.trials or DEFAULT_TRIALS,
                         objective=args.objective, remeasure=args.remeasure,
                         confirm_rounds=args.confirm_rounds, baseline=baseline,
                         min_gain=args.min_gain, prometheus=prometheus, seed=args.seed,
                         fixed=fixed, warmup_requests=args.warmup_requests)
    if args.objective == "capacity":
        return capacity_cli.run(parser, args, config, source, profile)
    from tuner.measure.loadgen import LoadError
    try:
        study = run_sweep(config, show_progress=not args.no_progress)
    except ValueError as exc:  # e.g. the study exists with another objective
        parser.error(str(exc))
    except LoadError as exc:  # the harness failed while confirming: resumable
        print(f"load or metrics harness failed: {exc}\nre-run the same command to resume",
              file=sys.stderr)
        return 1
    source.write_document(out_dir)
    code = _print_results(study, out=Path(args.out) if args.out else out_dir / "best.yaml",
                          out_dir=out_dir)
    if code == 0 and args.capacity:
        from tuner.measure.capacity import for_sweep
        print(for_sweep(study, config, trace_rate=source.trace_rate,
                        max_probes=args.capacity, sustain=args.sustain).line())
    return code


def _print_results(study, *, out: Path, out_dir: Path, top: int = 5) -> int:
    from tuner.search.plots import save_plots
    from tuner.search.report import (best_table, confirmation_table, context, engine_patch,
                              patch_yaml, result_line, validate_patch)

    print(f"\nstudy {study.study_name!r}: {context(study)}")
    print("\nsearch (one measurement per trial):")
    print(best_table(study, top=top))
    table = confirmation_table(study)
    if table:
        print("\nconfirmation (baseline and candidates re-measured interleaved; gain = "
              "goodput ratio, 95% t-interval on paired per-round log ratios):")
        print(table)
    print(f"\nresult: {result_line(study)}")
    text = patch_yaml(study)
    if text is None:
        print("no feasible trial: nothing to write", file=sys.stderr)
        return 1
    try:
        validated = validate_patch(engine_patch(study))
    except ValueError as exc:
        print(f"the best settings do not fit the PagedInferenceService CRD: {exc}",
              file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"\n{text}\nwritten to {out}"
          + ("" if validated else " (no CRD found to validate against)"))
    for path in save_plots(study, out_dir):
        print(f"plot: {path}")
    return 0


def _report(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import optuna

    from tuner.search.study import make_storage
    from tuner.search.sweep import quiet_optuna
    quiet_optuna()
    storage = make_storage(args.storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    name = args.study_name or (names[0] if len(names) == 1 else None)
    if name is None or name not in names:
        parser.error(f"--study-name: choose one of {names or '(no study in ' + args.storage + ')'}")
    study = optuna.load_study(study_name=name, storage=storage)
    out_dir = Path(args.out_dir or Path("tuner-out") / name)
    return _print_results(study, out=Path(args.out) if args.out else out_dir / "best.yaml",
                          out_dir=out_dir, top=args.top)


def _bench_target(parser: argparse.ArgumentParser, args: argparse.Namespace, load, slos) -> int:
    """--target-url: measure a running server (no tuning), print and save the figures."""
    from tuner.measure.trial import measure

    url = args.target_url.rstrip("/")
    try:
        httpx.get(url + "/v1/models", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        parser.error(f"--target-url {url} is not reachable ({type(exc).__name__}: {exc}); "
                     "start the server or fix the URL")
    out_dir = Path(args.out_dir or Path("tuner-out") / f"bench-{args.workload}")
    runs = []
    for i in range(args.trials or 1):
        figures = measure(url, load, slos, workdir=out_dir / f"run-{i}",
                          warmup_requests=args.warmup_requests)
        runs.append(figures)
        print(f"run {i}: goodput {figures['goodput']:.3f} req/s, throughput "
              f"{figures['throughput']:.3f} req/s, ttft p99 {figures.get('ttft_p99', float('nan')):.3f} s,"
              f" e2e p99 {figures.get('e2e_p99', float('nan')):.3f} s")
    out = Path(args.out) if args.out else out_dir / "bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"target_url": url, "workload": args.workload, "slos": slos,
                               "runs": runs}, indent=2))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    # SIGTERM (a Job being stopped) unwinds like Ctrl-C, so the running trial's engine
    # and Locust subprocesses are stopped and the trial is marked failed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
