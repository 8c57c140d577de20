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

import dataclasses
import logging
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from tqdm import tqdm

from tuner.search import study as st
from tuner.search.confirm import Baseline, load_baseline, run_confirmation
from tuner.measure.loadgen import LoadError, LoadSpec
from tuner.measure.promql import PrometheusReader
from tuner.search.space import Param, engine_flags
from tuner.measure.trial import EngineLaunch, Infeasible, run_trial


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


def trial_line(trial: optuna.trial.FrozenTrial, primary: str) -> str:
    attrs = trial.user_attrs
    head = f"trial {trial.number:>3} {_describe(trial.params)}"
    if "infeasible" in attrs:
        return f"{head} -> infeasible: {attrs['infeasible']}"
    if trial.state != optuna.trial.TrialState.COMPLETE:
        extra = f" at goodput {attrs['goodput']:.2f} req/s" if "goodput" in attrs else ""
        return f"{head} -> {trial.state.name.lower()}{extra}"
    tag = ""
    p99 = attrs.get(f"{primary}_p99")
    p99_text = f", {primary} p99 {p99:.3f} s" if p99 is not None else ""
    return (f"{head} -> goodput {attrs.get('goodput', 0):.2f} req/s, throughput "
            f"{attrs.get('throughput', 0):.2f} req/s{p99_text}{tag}")


class Objective:
    """The Optuna objective; figures land on the trial as user attributes."""

    def __init__(self, config: SweepConfig) -> None:
        self.config = config

    def __call__(self, trial: optuna.Trial):
        c = self.config
        settings = {p.name: p.suggest(trial) for p in c.space}
        workdir = c.out_dir / "trials" / f"trial-{trial.number:04d}"
        prune_on = c.objective == "goodput"
        steps = iter(range(10_000))
        pruned = []

        def on_progress(elapsed: float, goodput: float) -> bool:
            if not prune_on:
                return False
            trial.report(goodput, next(steps))
            if trial.should_prune():
                pruned.append(elapsed)
                return True
            return False

        try:
            merged = {**c.fixed, **settings}
            if merged.get("max_num_batched_tokens", 1 << 62) < merged.get("max_num_seqs", 0):
                raise Infeasible("max_num_batched_tokens < max_num_seqs (the CRD rejects it)")
            figures = run_trial(engine_flags(merged), c.launch, c.load, c.slos,
                                workdir=workdir, warmup_requests=c.warmup_requests,
                                on_progress=on_progress, progress_interval=c.progress_interval,
                                prometheus=c.prometheus)
        except Infeasible as exc:
            trial.set_user_attr("infeasible", exc.reason)
            trial.set_constraint("engine_serves", 1.0)
            return st.INFEASIBLE_VALUES[c.objective] if c.objective == "pareto" else 0.0
        for key, value in figures.items():
            trial.set_user_attr(key, value)
        trial.set_constraint("engine_serves", 0.0)
        if pruned:
            raise optuna.TrialPruned(f"goodput behind after {pruned[0]:.0f} s")
        if c.objective == "pareto":
            return figures["throughput"], figures.get(f"{c.primary_latency}_p99", 1e9)
        return figures["goodput"]


def quiet_optuna() -> None:
    """Only warnings from Optuna, and none about its experimental features we rely on."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


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
    objective = Objective(config)
    done = st.search_trials_done(study)
    bar = tqdm(total=config.trials, initial=min(done, config.trials), unit="trial",
               desc=f"sweep {config.workload}", file=sys.stderr, disable=not show_progress,
               dynamic_ncols=True)

    def after(study_: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        bar.write(trial_line(trial, config.primary_latency), file=sys.stderr)
        bar.update(1)
        best = st.best_group(study_)
        if best is not None:
            bar.set_postfix(best_goodput=f"{best['goodput']:.2f}")

    catch = (LoadError,)  # a harness failure fails the trial, not the sweep
    try:
        while st.search_trials_done(study) < config.trials:
            study.optimize(objective, n_trials=1, catch=catch, callbacks=[after])
    finally:
        bar.close()
    if config.remeasure > 0 and config.confirm_rounds > 0:
        confirm(study, config)
    return study


def confirm(study: optuna.Study, config: SweepConfig) -> dict:
    """Re-measure the baseline and the best `remeasure` settings (tuner.search.confirm)."""
    baseline = config.baseline or load_baseline(
        None, fixed=config.fixed, searched=[p.name for p in config.space])

    def measure(flags: list[str], seed: int, workdir: Path) -> dict:
        return run_trial(flags, config.launch, dataclasses.replace(config.load, seed=seed),
                         config.slos, workdir=workdir, warmup_requests=config.warmup_requests,
                         prometheus=config.prometheus)

    return run_confirmation(study, baseline=baseline, k=config.remeasure,
                            rounds=config.confirm_rounds, seed=config.seed,
                            floor=0.5 / config.load.duration, out_dir=config.out_dir,
                            fixed=config.fixed, measure=measure, min_gain=config.min_gain)
