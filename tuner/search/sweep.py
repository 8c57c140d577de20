"""`python -m tuner sweep`: the search loop.

Each trial: Optuna proposes settings -> an engine starts with them -> the workload runs
for --duration seconds -> goodput (and the other figures) go back to Optuna. Trials
whose intermediate goodput is clearly behind (bottom quarter of earlier trials at the same
point) are pruned. `--trials N` is the total number of search trials in the study, so
re-running the same command resumes an interrupted sweep; several processes (machines,
Kubernetes Jobs) pointed at one PostgreSQL --storage share the N trials.
After the search, the baseline (current settings) and the best K settings are
re-measured interleaved for R rounds and a setting replaces the baseline only when its
gain's 95 % interval lies above 1 (tuner.search.confirm, tuner.search.stats).
"""
from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from tqdm import tqdm

from tuner.search import study as st
from tuner.measure.loadgen import LoadSpec
from tuner.measure.local import EngineLaunch, EngineRunner
from tuner.measure.promql import PrometheusReader
from tuner.search.confirm import Baseline, load_baseline, run_confirmation
from tuner.search.loop import Outcome, run_search
from paged_api.search_space import Param


@dataclass
class SweepConfig:
    workload: str
    slos: dict
    primary_latency: str
    space: list[Param]
    load: LoadSpec
    launch: EngineLaunch
    storage: str
    study_name: str
    out_dir: Path
    trials: int = 8
    objective: str = "goodput"
    remeasure: int = 1          # K: candidates re-measured against the baseline (0: none)
    confirm_rounds: int = 3     # R: interleaved rounds of baseline + candidates
    baseline: Baseline | None = None  # default: the engine's defaults (plus `fixed`)
    min_gain: float = 1.0
    prometheus: PrometheusReader | None = None  # None: scrape /metrics (the default)
    seed: int = 0
    fixed: dict = field(default_factory=dict)   # settings passed to every trial (--set)
    warmup_requests: int = 2
    progress_interval: float = 2.0
    sampler: optuna.samplers.BaseSampler | None = None  # default: TPE


def _describe(params: dict) -> str:
    return " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in params.items())


def trial_line(number: int, outcome: Outcome, primary: str) -> str:
    head = f"trial {number:>3} {_describe(outcome.params)}"
    if outcome.infeasible is not None:
        return f"{head} -> infeasible: {outcome.infeasible}"
    if outcome.failed is not None:
        return f"{head} -> fail: {outcome.failed}"
    figures = outcome.figures or {}
    if outcome.pruned_after is not None:
        return f"{head} -> pruned at goodput {figures.get('goodput', 0):.2f} req/s"
    p99 = figures.get(f"{primary}_p99")
    p99_text = f", {primary} p99 {p99:.3f} s" if p99 is not None else ""
    return (f"{head} -> goodput {figures.get('goodput', 0):.2f} req/s, throughput "
            f"{figures.get('throughput', 0):.2f} req/s{p99_text}")


def runner_for(config: SweepConfig) -> EngineRunner:
    return EngineRunner(config.launch, config.load, config.slos,
                        warmup_requests=config.warmup_requests,
                        progress_interval=config.progress_interval,
                        prometheus=config.prometheus)


def quiet_optuna() -> None:
    """Only warnings from Optuna, and none about its experimental features we rely on."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # the search loop asks and tells (tuner/search/loop.py), beating the heartbeat itself
    warnings.filterwarnings("ignore", message="Heartbeat of storage")


def run_sweep(config: SweepConfig, *, show_progress: bool = True) -> optuna.Study:
    quiet_optuna()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    study = st.open_study(storage=config.storage, study_name=config.study_name,
                          objective=config.objective, seed=config.seed,
                          n_startup_trials=min(10, max(2, config.trials // 3)),
                          sampler=config.sampler)
    load = config.load
    study.set_user_attr("config", {
        "workload": config.workload, "slos": config.slos, "objective": config.objective,
        "primary_latency": config.primary_latency, "fixed": config.fixed,
        "model": config.launch.model, "duration": load.duration, "users": load.users,
        "arrival": load.arrival, "rate": load.rate, "length_scale": load.length_scale,
        "engine_flags": list(config.launch.extra_flags),
        "metrics_source": config.prometheus.url if config.prometheus else "/metrics"})
    done = st.search_trials_done(study)
    bar = tqdm(total=config.trials, initial=min(done, config.trials), unit="trial",
               desc=f"sweep {config.workload}", file=sys.stderr, disable=not show_progress,
               dynamic_ncols=True)
    best = [max((g["goodput"] for g in [st.best_group(study)] if g), default=None)]

    def after(trial: optuna.Trial, outcome: Outcome) -> None:
        bar.write(trial_line(trial.number, outcome, config.primary_latency), file=sys.stderr)
        bar.update(1)
        if outcome.figures and outcome.pruned_after is None and \
                (best[0] is None or outcome.figures["goodput"] > best[0]):
            best[0] = outcome.figures["goodput"]
            bar.set_postfix(best_goodput=f"{best[0]:.2f}")

    try:
        run_search(study, config.space, runner_for(config), total=config.trials,
                   workdir=config.out_dir / "trials", seed=config.load.seed,
                   objective=config.objective, primary_latency=config.primary_latency,
                   fixed=config.fixed, prune=True, heartbeats=True, on_result=after)
    finally:
        bar.close()
    if config.remeasure > 0 and config.confirm_rounds > 0:
        confirm(study, config)
    return study


def confirm(study: optuna.Study, config: SweepConfig) -> dict:
    """Re-measure the baseline and the best `remeasure` settings (tuner.search.confirm)."""
    baseline = config.baseline or load_baseline(
        None, fixed=config.fixed, searched=[p.name for p in config.space])
    return run_confirmation(study, baseline=baseline, k=config.remeasure,
                            rounds=config.confirm_rounds, seed=config.seed,
                            floor=0.5 / config.load.duration, out_dir=config.out_dir,
                            fixed=config.fixed, runner=runner_for(config),
                            min_gain=config.min_gain)
