"""The search loop, shared by `python -m tuner sweep` and the in-cluster tuning Job.

Ask up to `parallelism` trials of the study, let Optuna suggest each one's settings from
the space, hand them to a `TrialRunner` (tuner/measure/runner.py), tell the results:

- measured: the objective's values (goodput; or throughput and primary p99 latency for
  "pareto"), every figure as a user attribute;
- infeasible (the settings break a rule of api/paged_api/settings.py, or the engine could not
  serve them): COMPLETE with the worst values, the violated constraint `engine_serves`
  and the reason in user attribute `infeasible` (tuner/search/study.py);
- pruned (goodput clearly behind earlier trials at the same point; single objective and
  `prune` only): PRUNED;
- the harness failed (LoadError): FAIL; the search goes on.

`total` counts the study's search trials whoever measured them, so a resumed study (or
several processes and pods sharing one) stops at `total`. When the budget is taken by
trials still running elsewhere, `wait_for_others(study)` is called until they finish, or
the loop ends when there is none.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import optuna
from optuna.storages._heartbeat import get_heartbeat_thread, is_heartbeat_enabled
from optuna.trial import TrialState

from paged_api import settings as engine_settings
from tuner.measure.loadgen import LoadError
from tuner.measure.runner import Infeasible, TrialRequest, TrialRunner
from tuner.search import study as st
from paged_api.search_space import Param


@dataclass
class Outcome:
    """What one search trial came to (exactly one of figures, infeasible, failed)."""

    params: dict[str, Any]
    figures: dict[str, float] | None = None
    infeasible: str | None = None
    failed: str | None = None
    pruned_after: float | None = None   # seconds of load when pruning stopped it


def run_search(study: optuna.Study, space: Iterable[Param], runner: TrialRunner, *,
               total: int, workdir: Path, seed: int = 0, objective: str = "goodput",
               primary_latency: str = "ttft", fixed: dict[str, Any] | None = None,
               parallelism: int = 1, prune: bool = False, heartbeats: bool = False,
               trial_attrs: dict[str, Any] | None = None,
               on_result: Callable[[optuna.Trial, Outcome], None] | None = None,
               on_batch: Callable[[optuna.Study], None] | None = None,
               wait_for_others: Callable[[optuna.Study], None] | None = None) -> None:
    """Run search trials until the study holds `total`. `fixed` settings go to every
    trial; `trial_attrs` are set on each asked trial; `on_result(trial, outcome)` runs
    before the trial is told (user attributes set there are stored with it);
    `on_batch(study)` after each batch is told."""
    space = list(space)
    fixed = dict(fixed or {})
    heartbeats = heartbeats and is_heartbeat_enabled(study._storage)
    while True:
        if heartbeats:   # a crashed worker's trial: failed, and queued again (study.py)
            optuna.storages.fail_stale_trials(study)
        done = st.search_trials_done(study)
        budget = total - done - len(st.running_trials(study))
        if budget <= 0:
            if done >= total or wait_for_others is None:
                return
            wait_for_others(study)
            continue
        asked = []
        for _ in range(min(parallelism, budget)):
            trial = study.ask()
            for key, value in (trial_attrs or {}).items():
                trial.set_user_attr(key, value)
            if st.beyond_total(study, trial.number, total):   # another worker raced us
                trial.set_user_attr("surplus", True)
                study.tell(trial, state=TrialState.FAIL)
            else:
                asked.append(trial)
        if not asked:
            continue
        chosen = [{p.name: p.suggest(t) for p in space} for t in asked]

        def measure(trial: optuna.Trial, params: dict) -> Outcome:
            beat = (get_heartbeat_thread(trial._trial_id, study._storage) if heartbeats
                    else contextlib.nullcontext())
            with beat:
                return _measure(runner, trial, params, fixed=fixed, seed=seed,
                                workdir=workdir, prune=prune and objective == "goodput")

        if len(asked) == 1:
            outcomes = [measure(asked[0], chosen[0])]
        else:
            with ThreadPoolExecutor(len(asked)) as pool:
                outcomes = list(pool.map(measure, asked, chosen))
        for trial, outcome in zip(asked, outcomes):
            _tell(study, trial, outcome, objective=objective, primary=primary_latency,
                  on_result=on_result)
        if on_batch is not None:
            on_batch(study)


def _measure(runner: TrialRunner, trial: optuna.Trial, params: dict, *, fixed: dict,
             seed: int, workdir: Path, prune: bool) -> Outcome:
    settings = {**fixed, **params}
    steps = iter(range(1_000_000))
    pruned: list[float] = []

    def on_progress(elapsed: float, goodput: float) -> bool:
        trial.report(goodput, next(steps))
        if trial.should_prune():
            pruned.append(elapsed)
            return True
        return False

    try:
        engine_settings.check_rules(settings)
    except ValueError as exc:   # the engine (and the CRD) would refuse these settings
        return Outcome(params, infeasible=str(exc))
    name = f"trial-{trial.number:04d}"
    request = TrialRequest(name=name, settings=settings, seed=seed, workdir=workdir / name,
                           on_progress=on_progress if prune else None)
    try:
        figures = runner.run(request)
    except Infeasible as exc:
        return Outcome(params, infeasible=exc.reason)
    except LoadError as exc:
        return Outcome(params, failed=str(exc))
    return Outcome(params, figures=figures, pruned_after=pruned[0] if pruned else None)


def _tell(study: optuna.Study, trial: optuna.Trial, outcome: Outcome, *, objective: str,
          primary: str, on_result: Callable[[optuna.Trial, Outcome], None] | None) -> None:
    for key, value in (outcome.figures or {}).items():
        trial.set_user_attr(key, value)
    if outcome.infeasible is not None:
        trial.set_user_attr("infeasible", outcome.infeasible)
        trial.set_constraint("engine_serves", 1.0)
    elif outcome.figures is not None:
        trial.set_constraint("engine_serves", 0.0)
    if on_result is not None:
        on_result(trial, outcome)
    if outcome.failed is not None:
        trial.set_user_attr("failed", outcome.failed)
        study.tell(trial, state=TrialState.FAIL)
    elif outcome.infeasible is not None:
        study.tell(trial, list(st.INFEASIBLE_VALUES[objective]))
    elif outcome.pruned_after is not None:
        study.tell(trial, state=TrialState.PRUNED)
    elif objective == "pareto":
        study.tell(trial, [outcome.figures["throughput"],
                           outcome.figures.get(f"{primary}_p99", 1e9)])
    else:
        study.tell(trial, outcome.figures["goodput"])
