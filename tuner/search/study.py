"""Optuna study plumbing: storage, sampler, pruner, and reading results back.

Objectives:
- "goodput" (default): maximise goodput (req/s meeting every SLO); pruning on.
- "pareto": maximise throughput (completed req/s) and minimise the workload's primary
  p99 latency (client side); the result is a Pareto front. Optuna cannot prune
  multi-objective trials, so pruning is off.

Infeasible trials (engine failed to start, ran out of memory) finish COMPLETE with the
worst values, a violated constraint (`trial.set_constraint("engine_serves", 1.0)`) and
the reason in user attr `infeasible`: TPE ranks constrained-out trials below every
feasible one and steers away from them, and the sweep goes on.
"""
from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

INFEASIBLE_VALUES = {"goodput": (0.0,), "pareto": (0.0, 1e9)}


class TrialSeededTPESampler(optuna.samplers.TPESampler):
    """TPE whose random state is re-seeded from (seed, trial number) before each trial.

    Workers sharing a study each start their sampler with the same --seed; seeded once,
    they would propose the same startup points. Trial numbers are handed out by the
    storage, one per trial across all workers, so seeding per trial gives every worker
    (and every trial) its own stream, and a single worker's sweep stays reproducible.
    """

    def __init__(self, *, seed: int = 0, **kwargs) -> None:
        super().__init__(seed=seed, **kwargs)
        self._base_seed = seed

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        derived = (self._base_seed * 1_000_003 + trial.number) % (2 ** 32)
        # TPESampler keeps two numpy RandomStates (its own and its startup RandomSampler's)
        # behind LazyRandomState; re-seed both.
        self._rng.rng.seed(derived)
        self._random_sampler._rng.rng.seed(derived)
        super().before_trial(study, trial)


STALE_GRACE_ENV = "TUNER_STALE_TRIAL_GRACE_S"


def stale_grace() -> float:
    """Seconds without a heartbeat after which a running trial is stale (its worker died):
    120, or $TUNER_STALE_TRIAL_GRACE_S (tests use a few seconds)."""
    text = os.environ.get(STALE_GRACE_ENV, "120")
    try:
        grace = float(text)
    except ValueError:
        grace = 0.0
    if not grace >= 2:
        raise ValueError(f"{STALE_GRACE_ENV}={text!r}: give a number of seconds >= 2")
    return grace


# PostgreSQL's SQLSTATEs for a table, or an enum type, another worker created meanwhile
CREATED_MEANWHILE = {"42P07", "42710"}


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB storage with heartbeats, so a trial of a crashed worker is retried.

    A trial whose worker stopped beating for `stale_grace()` seconds is failed by the next
    `study.optimize` of any worker, and one copy of it is queued (same settings); the copy
    replaces it in the trial count (`search_trials_done`).
    Workers started together on an empty database race to create Optuna's tables: the
    loser gets a unique-violation on PostgreSQL's catalog, or, a moment later, "relation
    already exists" for a table (42P07) or Optuna's enum type (42710), ProgrammingErrors
    (CI 2026-12-07 met both); it retries,
    finding them made. Any other ProgrammingError is a real error.
    """
    import sqlalchemy.exc
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        path.parent.mkdir(parents=True, exist_ok=True)
    grace = stale_grace()
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=max(1, min(30, int(grace // 4))),
                grace_period=int(grace),
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=1))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
            lost_race = isinstance(exc, sqlalchemy.exc.IntegrityError) or \
                getattr(exc.orig, "sqlstate", None) in CREATED_MEANWHILE
            if attempt == 4 or not lost_race:
                raise
            time.sleep(random.uniform(0.2, 1.0))
    raise AssertionError("unreachable")


def open_study(*, storage: str, study_name: str, objective: str, seed: int = 0,
               n_startup_trials: int = 4, sampler: optuna.samplers.BaseSampler | None = None
               ) -> optuna.Study:
    """Create or resume a study; ValueError if it exists with the other objective."""
    directions = ["maximize"] if objective == "goodput" else ["maximize", "minimize"]
    sampler = sampler or TrialSeededTPESampler(
        seed=seed, n_startup_trials=n_startup_trials, multivariate=True, constant_liar=True)
    pruner = (optuna.pruners.PercentilePruner(75.0, n_startup_trials=3, n_warmup_steps=1)
              if objective == "goodput" else optuna.pruners.NopPruner())
    study = optuna.create_study(storage=make_storage(storage), study_name=study_name,
                                directions=directions, sampler=sampler, pruner=pruner,
                                load_if_exists=True)
    if len(study.directions) != len(directions):
        raise ValueError(f"study {study_name!r} in {storage} was made with the other "
                         f"objective; pass --study-name to start a new one")
    return study


def search_trials_done(study: optuna.Study) -> int:
    """Finished search trials (running ones excluded). A stale trial failed and queued
    again (make_storage) counts once: its copy counts, the failed original does not."""
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    return sum(1 for t in trials if not t.user_attrs.get("surplus") and (
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and t.number not in retried)))


def beyond_total(study: optuna.Study, number: int, total: int) -> bool:
    """Whether trial `number` is past the first `total` trials of the study: workers that
    count and then ask can race past the total; the first `total` by trial number (the
    storage hands numbers out one at a time) are the ones to measure. A trial beyond it
    is told FAIL with user attr `surplus` and counts nowhere."""
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    ahead = sum(1 for t in trials if t.number < number and not t.user_attrs.get("surplus")
                and not (t.state == TrialState.FAIL and t.number in retried))
    return ahead >= total


def running_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials being measured now, by this process or another sharing the study."""
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def feasible(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and "infeasible" not in trial.user_attrs


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def grouped(study: optuna.Study) -> list[dict]:
    """Feasible complete trials grouped by settings: each group has `params`, `trials`
    (numbers), `goodput` (mean over measurements) and `measurements`; best first."""
    groups: dict[tuple, list[FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if feasible(t):
            groups.setdefault(_key(t.params), []).append(t)
    out = []
    for trials in groups.values():
        values = [t.user_attrs.get("goodput", 0.0) for t in trials]
        out.append({"params": dict(trials[0].params), "trials": [t.number for t in trials],
                    "goodput": statistics.fmean(values), "measurements": len(values),
                    "goodput_stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "figures": _mean_figures(trials)})
    out.sort(key=lambda g: g["goodput"], reverse=True)
    return out


def _mean_figures(trials: list[FrozenTrial]) -> dict[str, float]:
    keys = {k for t in trials for k, v in t.user_attrs.items() if isinstance(v, (int, float))}
    return {k: statistics.fmean(t.user_attrs[k] for t in trials if k in t.user_attrs)
            for k in keys}


def ranked_groups(study: optuna.Study) -> list[dict]:
    """Settings groups, best search goodput first; in pareto mode the Pareto-optimal
    feasible settings come first."""
    groups = grouped(study)
    if len(study.directions) > 1:
        front = {_key(t.params) for t in study.best_trials if feasible(t)}
        groups.sort(key=lambda g: _key(g["params"]) not in front)  # stable: goodput order kept
    return groups


def best_group(study: optuna.Study) -> dict | None:
    """The search's best settings (goodput mode: best mean goodput; pareto mode: the
    Pareto-optimal settings with the best goodput). Not the decision: that is the
    confirmation's (tuner.search.confirm)."""
    groups = ranked_groups(study)
    return groups[0] if groups else None
