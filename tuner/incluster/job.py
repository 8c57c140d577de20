"""`python -m tuner tune --cluster --name PIT`: the PagedInferenceTuning Job's program.

Reads the tuning resource and its target PagedInferenceService, then
1. search: each trial is a trial PagedInferenceService owned by the tuning resource (the
   target's spec with the candidate spec.engine, one replica): wait for Ready (Degraded =
   infeasible, with the engine's own message), drive the Locust workload at its ready
   address, read figures (PromQL with spec.prometheus.url, else /metrics), delete it.
   `parallelism` trials run at once. A small all-choices space is searched exhaustively.
   With spec.tunerPods N (an Indexed Job, spec.storage's shared study), N pods ask and
   tell trials of one study until it holds spec.trials; pod 0 (JOB_COMPLETION_INDEX 0)
   waits for the others' trials, then alone confirms and applies; the others exit.
   The load is spec.workload or spec.workloadFrom (a trace, or a fit from Prometheus), by
   spec.loadWorkers Locust processes (tuner.incluster.load).
2. confirm: the target's current settings (the baseline) and the best candidates
   re-measured interleaved on fresh trial services (tuner.search.confirm, tuner.search.stats): gains
   with 95 % intervals and the decision.
3. apply (tuner.incluster.apply): the capacity of the winning settings when asked for or
   needed (Auto on an autoscaled target); Manual writes the recommendation; Auto patches
   the target (and its autoscaler's target), verifies and rolls back if the gain did not
   hold.
With spec.objective Capacity the three steps are tuner/incluster/capacity_job.py's instead:
a pilot of the target's settings that times the simulator, the search on the simulator,
the confirmation of capacities on trial services; then the same apply.
Status is written after every step. Search results are kept in status.history, so a
restarted Job (the operator restarts failed ones) resumes the study where it stopped.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from tuner.incluster import capacity_job
from tuner.incluster import load as cluster_load
from tuner.search import study as st
from tuner.incluster.apply import apply_decision, arm_goodput
from tuner.incluster.cluster import Cluster, api_key, current_namespace, load_client
from tuner.incluster.history import best_of, pareto
from tuner.incluster.service_runner import ServiceRunner
from tuner.incluster.space_bounds import job_space
from paged_api.contract import (BY_KEY, INDEX_ENV, STORAGE_URL_ENV,
                                     TuningSpec, parse_tuning)
from tuner.measure.promql import PrometheusReader
from tuner.search.confirm import Baseline, run_confirmation
from tuner.search.loop import Outcome, run_search
from paged_api.search_space import from_engine_spec, sections_baseline, to_spec_patch
from tuner.search.sweep import quiet_optuna
from tuner.sources.workload_source import WorkloadSource

FINAL = ("Succeeded", "Failed")


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


class Tuning:
    """One run of the loop for one tuning resource."""

    def __init__(self, cluster: Cluster, body: dict, spec: TuningSpec, target: dict,
                 out_dir: Path, source: WorkloadSource) -> None:
        self.cluster, self.body, self.spec, self.target = cluster, body, spec, target
        self.name = body["metadata"]["name"]
        self.out_dir, self.source = out_dir, source
        self.owner = cluster.owner_ref(body)
        self.status: dict[str, Any] = dict(body.get("status") or {})
        self.target_engine: dict = dict(target["spec"].get("engine") or {})
        self.load, self.slos = cluster_load.load_spec(
            spec, source, model_name=(target["spec"].get("model") or {}).get("servedName")
            or None)
        self.prometheus = PrometheusReader(spec.prometheus_url) if spec.prometheus_url else None
        self.pod = os.environ.get("HOSTNAME") or socket.gethostname()   # in each trial's entry
        self.runner = ServiceRunner(cluster, self.name, self.owner, target, self.load,
                                    self.slos, spec.startup_timeout,
                                    warmup_requests=spec.warmup_requests,
                                    prometheus=self.prometheus, log=log)

    def publish(self, **fields: Any) -> None:
        self.status.update(fields)
        self.cluster.write_status(fields)

    # ---- search ----
    def grid(self) -> list[dict] | None:
        """Every combination, when the space is all choices and `trials` covers it."""
        if any(p.choices is None for p in self.spec.space):
            return None
        combos = [dict(zip([p.name for p in self.spec.space], values)) for values in
                  itertools.product(*[p.choices for p in self.spec.space])]
        return combos if len(combos) <= self.spec.trials else None

    def search(self, study: optuna.Study, *, index: int = 0) -> None:
        """`index`: this pod's JOB_COMPLETION_INDEX. Pod 0 (the lead, or the only pod)
        replays status.history into a new study, queues the grid, publishes the phase,
        and waits for the other pods' trials."""
        lead = index == 0
        self._fail_mine(study, index)
        history: list[dict] = list(self.status.get("history") or [])
        if lead and not study.trials:
            for entry in history:   # a restarted Job: replay what was measured
                self._replay(study, entry)
        grid = self.grid()
        total = len(grid) if grid is not None else self.spec.trials
        if grid is not None and lead:
            seen = [entry["params"] for entry in history]
            for combo in grid:
                if combo not in seen:
                    study.enqueue_trial(combo, skip_if_exists=True)
        elif grid is not None:   # the lead queues the grid: wait for it
            deadline = time.monotonic() + 120
            while not study.get_trials(deepcopy=False) and time.monotonic() < deadline:
                time.sleep(0.5)
        if lead:
            self.publish(phase="Searching", trialsTotal=total,
                         trialsText=f"{st.search_trials_done(study)}/{total}")

        def entry(trial: optuna.Trial, outcome: Outcome) -> None:
            """The trial's line of status.history, kept on the trial in the study."""
            params = outcome.params
            record = {"trial": trial.number, "params": params,
                      **to_spec_patch(params, record=True),
                      "pod": self.pod}
            if outcome.figures is not None:
                record.update(goodput=round(outcome.figures["goodput"], 4),
                              ttftP99=round(outcome.figures.get("ttft_p99", 0.0), 4),
                              requests=int(outcome.figures.get("requests", 0)))
            elif outcome.infeasible is not None:
                log(f"trial {trial.number} {params}: infeasible: {outcome.infeasible}")
                record["infeasible"] = outcome.infeasible
            else:
                log(f"trial {trial.number} {params}: harness failed: {outcome.failed}")
                record["failed"] = outcome.failed
            trial.set_user_attr("entry", record)

        def wait_for_others(study_: optuna.Study) -> None:
            self._fail_stale(study_)   # the lead waits for the other pods' trials
            time.sleep(1.0)

        run_search(study, self.spec.space, self.runner, total=total,
                   workdir=self.out_dir / "trials", seed=self.spec.seed,
                   parallelism=self.spec.parallelism, trial_attrs={"tunerIndex": index},
                   on_result=entry, on_batch=lambda s: self._publish_history(s, total),
                   wait_for_others=wait_for_others if lead else None)
        self._publish_history(study, total)

    def _publish_history(self, study: optuna.Study, total: int) -> None:
        """status.history from the study's trials: all pods' (each trial's `entry`)."""
        history = sorted((t.user_attrs["entry"] for t in study.get_trials(deepcopy=False)
                          if "entry" in t.user_attrs), key=lambda e: e["trial"])
        done = st.search_trials_done(study)
        self.publish(history=history, trialsDone=done, trialsText=f"{done}/{total}",
                     best=best_of(history), pareto=pareto(history))

    def _fail_mine(self, study: optuna.Study, index: int) -> None:
        """Trials left running by this index's previous pod (killed; the Job restarted
        it): failed, their trial services deleted."""
        for t in st.running_trials(study):
            if t.user_attrs.get("tunerIndex") == index:
                log(f"trial {t.number}: left running by this pod's predecessor")
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                self.cluster.delete_service(f"{self.name}-t{t.number}")

    def _fail_stale(self, study: optuna.Study) -> None:
        """Fail another pod's trial running far longer than a measurement can take (its
        pod died mid-trial): it counts as a failed trial, and the search ends."""
        limit = self.spec.startup_timeout + 3 * self.spec.duration + 300
        now = datetime.datetime.now()
        for t in st.running_trials(study):
            if t.datetime_start and (now - t.datetime_start).total_seconds() > limit:
                log(f"trial {t.number}: running for over {limit:.0f} s, its pod is gone")
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)

    def _replay(self, study: optuna.Study, entry: dict) -> None:
        study.enqueue_trial(entry["params"])
        trial = study.ask()
        for p in self.spec.space:
            p.suggest(trial)
        trial.set_user_attr("entry", entry)
        if "goodput" in entry:
            trial.set_user_attr("goodput", entry["goodput"])
            study.tell(trial, entry["goodput"])
        elif "infeasible" in entry:
            trial.set_user_attr("infeasible", entry["infeasible"])
            study.tell(trial, 0.0)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    # ---- confirm ----
    def baseline(self) -> Baseline:
        """The target's current settings."""
        known = {k: v for k, v in self.target_engine.items() if k in BY_KEY}
        params = {**from_engine_spec(known, where=f"{self.spec.target} spec.engine"),
                  **sections_baseline(self.target["spec"], self.spec.space,  # host KV tier
                                      where=f"{self.spec.target}'s spec")}
        return Baseline(params, params, f"{self.spec.target}'s spec.engine")

    def confirm(self, study: optuna.Study) -> dict:
        baseline = self.baseline()
        self.publish(phase="Confirming")
        return run_confirmation(study, baseline=baseline, k=self.spec.candidates,
                                rounds=self.spec.confirm_rounds, seed=self.spec.seed,
                                floor=0.5 / self.spec.duration, out_dir=self.out_dir,
                                fixed={}, runner=self.runner, log=log,
                                min_gain=self.spec.min_gain)

    def run(self, storage: str | None, *, index: int = 0) -> None:
        """`index`: this pod's JOB_COMPLETION_INDEX (spec.tunerPods > 1): only pod 0 goes
        past the search."""
        quiet_optuna()
        if self.spec.objective == "Capacity":
            self.run_capacity()
            return
        study = st.open_study(storage=storage or f"sqlite:///{self.out_dir}/study.db",
                              study_name=f"{self.cluster.ns}-{self.name}", objective="goodput",
                              seed=self.spec.seed,
                              n_startup_trials=min(10, max(2, self.spec.trials // 3)))
        if index > 0:
            self.search(study, index=index)
            log(f"pod {index}: the study holds its trials; pod 0 confirms and applies")
            return
        self.publish(workload=cluster_load.describe(self.spec, self.source))
        self.search(study)
        record = self.confirm(study)
        base = record["arms"][0]
        outside = {k: v for k, v in to_spec_patch(base["params"], record=True).items()
                   if k != "engine"}
        self.publish(baseline={"engine": self.target_engine, **outside, **arm_goodput(base)},
                     confirmation=[{"label": a["label"],
                                    **to_spec_patch(a["params"], record=True),
                                    "goodputs": [round(g, 4) for g in a["goodput"]],
                                    "failed": [f for f in a["failed"] if f]}
                                   for a in record["arms"]])
        apply_decision(self, record, capacity=self.capacity if cluster_load.wants_capacity(
            self.spec, self.target) else None)

    def run_capacity(self) -> None:
        """spec.objective Capacity (tuner/incluster/capacity_job.py)."""
        trials = f"{self.spec.trials} simulated"
        self.publish(workload=cluster_load.describe(self.spec, self.source), phase="Searching",
                     trialsTotal=self.spec.trials, trialsText=f"0/{trials}")
        try:
            record = capacity_job.run_sweep(self, self.baseline(), log)
        except ValueError as exc:   # no profile could be fitted, or the baseline refused
            self.publish(phase="Failed", decision={"winner": None, "reason": str(exc)})
            log(str(exc))
            return
        record["figure"] = "capacity"
        base = record["arms"][0]
        self.publish(**capacity_job.simulated_status(record),
                     trialsDone=len(record["simulated"]),
                     trialsText=f"{len(record['simulated'])}/{trials}",
                     baseline={"engine": self.target_engine,
                               **arm_goodput(base, "capacity"),
                               "simulated": round(base["sim"], 4)},
                     pilot=capacity_job.pilot_status(record),
                     confirmation=[{"label": a["label"],
                                    **to_spec_patch(a["params"], record=True),
                                    "simulated": round(a["sim"], 4),
                                    "capacities": [round(c, 4) for c in a["capacity"]],
                                    "failed": [f for f in a["failed"] if f],
                                    **({"refused": [{**to_spec_patch(r["params"], record=True),
                                                     "reason": r["reason"]}
                                                    for r in a["refused"]]}
                                       if a.get("refused") else {})}
                                   for a in record["arms"]])
        attainment = self.spec.capacity.attainment if self.spec.capacity else 0.9
        autoscaling = (self.target.get("spec") or {}).get("autoscaling")
        self.publish(capacity=capacity_job.capacity_status(record, attainment))
        apply_decision(self, record, verify_load=capacity_job.verify_capacity,
                       capacity=capacity_job.confirmed_capacity(record, attainment, autoscaling))

    def capacity(self, engine: dict, start: float, sections: dict | None = None) -> dict:
        self.publish(phase="MeasuringCapacity")
        return cluster_load.measure_capacity(self, engine, start=start, sections=sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", action="store_true", required=True,
                        help="tune in the cluster (the only mode so far)")
    parser.add_argument("--name", required=True, help="the PagedInferenceTuning")
    parser.add_argument("--namespace", default=None, help="default: the pod's own")
    parser.add_argument("--out-dir", default="tuner-out", help="logs and raw samples")
    parser.add_argument("--storage", default=None,
                        help="Optuna RDB URL (default: SQLite in --out-dir, resumed from "
                             "status.history); also $TUNER_STORAGE_URL")
    args = parser.parse_args(argv)
    cluster = Cluster(load_client(), args.namespace or current_namespace(), args.name)
    body = cluster.get_tuning()
    if body is None:
        log(f"no PagedInferenceTuning {args.name} in namespace {cluster.ns}")
        return 1
    if (body.get("status") or {}).get("phase") in FINAL:
        log(f"{args.name} is {body['status']['phase']} already: nothing to do")
        return 0
    try:
        spec = cluster_load.with_opt_in(parse_tuning(body.get("spec") or {}),
                                        body.get("spec") or {})
        target = cluster.get_service(spec.target)
        if target is None:
            raise ValueError(f"spec.targetRef.name: no PagedInferenceService {spec.target!r} "
                             f"in namespace {cluster.ns}")
        spec, searched = job_space(spec, body.get("spec") or {}, target)   # bounded
        cluster.write_status(searched)
        for note in searched["searchSpaceNotes"]:
            log(f"search space: {note}")
        if target["spec"].get("apiKeySecretRef"):   # the load sends it (loadtests.common)
            os.environ["PAGED_API_KEY"] = api_key(target["spec"]["apiKeySecretRef"])
        out_dir = Path(args.out_dir) / args.name
        out_dir.mkdir(parents=True, exist_ok=True)
        source = cluster_load.workload_source(spec, namespace=cluster.ns, out_dir=out_dir)
    except ValueError as exc:   # a spec to fix: no retry would help, the Job succeeds
        cluster.write_status({"phase": "Failed", "decision": {"reason": str(exc)}})
        log(str(exc))
        return 0

    def stop(*_: Any) -> None:
        # The Job is being deleted (or the tuning suspended): the workers stop their load
        # and delete their trial services; leftovers are deleted below.
        cluster.stopping.set()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    try:
        Tuning(cluster, body, spec, target, out_dir, source).run(
            args.storage or os.environ.get(STORAGE_URL_ENV) or None,
            index=int(os.environ.get(INDEX_ENV) or 0))
    finally:
        if cluster.stopping.is_set():
            for name in cluster.trial_names():
                cluster.delete_service(name)
    return 0

