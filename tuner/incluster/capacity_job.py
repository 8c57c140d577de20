"""spec.objective Capacity: the Job's capacity sweep (tuner/search/capacity_sweep.py) with
trial PagedInferenceServices for engines.

1. **Pilot**: the target's settings on a trial service, its real capacity searched while
   its /metrics step counters are read: the simulator's step times are fitted from them
   (tuner/sim/live_profile.py) and its KV pools sized from the pilot's
   (capacity_profile.fit_pool). The profile starts from the model's config.json only
   (calibrate.config_profile): the Job's pod may run on other hardware than the trial
   services, so no calibration is run or read here. With spec.prometheus.url the target's
   own served steps (its pods' series over the last 30 min) time it first
   (service_profile); the pilot then starts at that profile's capacity, and whichever of
   the two fits predicts the pilot's real capacity better is kept (live_refit).
2. **Search**: spec.trials settings of the (bounded) search space simulated, each with its
   capacity; the engine's own scheduler in virtual time, in this pod.
3. **Confirm**: the target's settings and the best confirm.candidates measured for real,
   confirm.rounds interleaved rounds, each measurement a short capacity search
   (spec.capacity.maxProbes probes of spec.trialDuration) on a fresh trial service named
   `<tuning>-c<N>`. The gain is the paired capacity ratio with its 95 % interval.

The record's decision goes to tuner.incluster.apply like the goodput loop's, with the
capacities as the arms' figure. A restarted Job runs the whole sweep again (the simulation
costs seconds; the real measurements are not resumed).
"""
from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

from paged_api import settings_k8s
from paged_api.model_source import parse_model
from tuner.incluster.service_runner import create_trial_service
from tuner.incluster.space_bounds import target_memory
from paged_api.search_space import to_spec_patch

GIB = 2**30
SERVICE_WINDOW = 1800.0  # s of the target's own steps read from Prometheus (the planner's)
SERVICE_EVERY = 15.0     # s between two readings of them
SIM_SHOWN = 10          # distinct simulated settings in status.simulation.best


class TrialService:
    """One engine of the capacity sweep (tuner.measure.capacity.measure_capacity's
    `launch.process(...)`): a trial PagedInferenceService with the target's spec and these
    settings."""

    def __init__(self, launch: "TrialServiceLaunch", name: str, settings: dict) -> None:
        self.launch, self.name, self.settings = launch, name, settings
        self.url = ""

    def start(self, timeout: float) -> None:
        run = self.launch.run
        create_trial_service(run.cluster, self.name, run.target, self.settings, run.owner)
        run.cluster.wait_ready(self.name, timeout=timeout)   # Infeasible when Degraded
        self.url = run.cluster.endpoint_url(self.name)
        self.launch.log(f"{self.name}: ready at {self.url}")

    def stop(self) -> None:
        self.launch.run.cluster.delete_service(self.name, wait=True)


class TrialServiceLaunch:
    """The capacity sweep's `config.launch` in a cluster."""

    def __init__(self, run, log) -> None:
        self.run, self.log = run, log
        self.startup_timeout = run.spec.startup_timeout
        self._numbers = itertools.count(1)

    def process(self, settings: dict, log_path: Path) -> TrialService:
        return TrialService(self, f"{self.run.name}-c{next(self._numbers)}", settings)


def simulator_base(target_spec: dict) -> dict:
    """The settings every simulated engine starts with: the target's spec.engine (as the
    engine takes them), its KV tiers (spec.kvCache: the host tier's size, and a disk tier
    as the engine's flags name it; the simulator writes no directory), and, on a CPU
    target, the CPU memory the operator gives its pods. A searched setting overrides its
    entry here (a candidate without the host tier turns it off)."""
    from paged_api.kv_cache import KV_DISK_DIR, parse_kv_cache

    base = {k: v for k, v in settings_k8s.from_spec(target_spec.get("engine") or {}).items()
            if v is not None}
    tiers = parse_kv_cache(target_spec.get("kvCache"), prefix_caching=True)
    if tiers is not None and tiers.host_bytes:
        base["kv_offloading_size"] = tiers.offload_gib
    if tiers is not None and tiers.disk_size_gib is not None:
        base |= {"kv_disk_dir": KV_DISK_DIR, "kv_disk_size": tiers.disk_size_gib}
    memory = target_memory(target_spec)
    if memory.on_cpu and memory.device_bytes:
        base["cpu_memory_gib"] = memory.device_bytes / GIB
    return base


def model_memory(profile, target_spec: dict):
    """`profile` (from config.json) with the KV bytes per token and the weights in the dtype
    the target's engine runs in (float32 on a CPU, as engine/kv_capacity.dtype_name says);
    unchanged when the model's facts are unknown."""
    import dataclasses

    from engine.kv_capacity import DTYPE_BYTES, dtype_name
    from tuner.incluster.model_facts import Unknown, model_facts
    from tuner.incluster.space_bounds import extra_arg

    facts = model_facts((target_spec.get("model") or {}).get("uri"))
    if isinstance(facts, Unknown):
        return profile
    args = [str(a) for a in (target_spec.get("engine") or {}).get("extraArgs") or []]
    device = "cpu" if target_memory(target_spec).on_cpu else "cuda"
    dtype = DTYPE_BYTES[dtype_name(extra_arg(args, "--dtype") or "auto", facts.config_dtype, device)]
    return dataclasses.replace(profile, memory=dataclasses.replace(
        profile.memory, kv_bytes_per_token=facts.kv_shape.bytes_per_token(dtype),
        weight_bytes=float(facts.parameters * dtype)))


def service_profile(run, profile, log, *, at: float | None = None):
    """`profile` timed by the target's own served steps, with spec.prometheus.url: its
    pods' paged:engine_step_* counters over the last SERVICE_WINDOW s (the SLO planner's
    LiveSteps reading), and the host KV tier's copy rates from the same series where the
    target runs a tier (live_profile.with_copy_rates; config.json has none, and untimed
    copies take no simulated time); `profile` unchanged without Prometheus or when the
    series holds too few busy windows (the pilot's steps time it then)."""
    import time

    from tuner.incluster.live_verify import target_selector
    from tuner.measure.promql import PrometheusError
    from tuner.sim.live_profile import live_profile, prometheus_series

    if run.prometheus is None:
        return profile
    end = time.time() if at is None else at
    sel = "{" + target_selector(run.cluster.ns, run.spec.target) + "}"
    try:
        series = prometheus_series(run.prometheus, sel, start=end - SERVICE_WINDOW, end=end,
                                   interval=SERVICE_EVERY)
        fitted = live_profile(profile, series)
    except (ValueError, PrometheusError) as exc:
        log(f"profile: none from {run.spec.target}'s own steps ({exc}); the pilot's time it")
        return profile
    log(f"profile: fitted from {run.spec.target}'s own {fitted.num_steps} served steps "
        f"(Prometheus), form {fitted.fit.form}, held-out error "
        f"{fitted.fit.heldout_error:.1%}; {fitted.memory.copies_text()}")
    return fitted


def build(run, baseline, log):
    """(SweepConfig, CapacityPlan) of the Job's capacity sweep; `baseline`: a
    tuner.search.confirm.Baseline of the target's settings."""
    from loadtests.workloads.trace import read_trace
    from tuner.measure.capacity import SUSTAIN_SECONDS
    from tuner.search.capacity_sweep import CapacityPlan
    from tuner.search.sweep import SweepConfig
    from tuner.sim.calibrate import config_profile
    from tuner.sim.context import SIM_WARMUP_REQUESTS, SimContext, engine_threads

    spec, target = run.spec, run.target["spec"]
    model = parse_model(target.get("model") or {}, default_name=run.spec.target).engine_arg
    base = simulator_base(target)
    params = spec.capacity
    attainment = params.attainment if params else 0.9
    sustain = params.sustain_seconds if params else SUSTAIN_SECONDS
    trace = read_trace(run.source.trace) if run.source.trace else None
    profile = service_profile(run, model_memory(config_profile(model, engine_threads(base)),
                                                target), log)
    sim = SimContext(profile, dict(run.slos),
                     workload=None if trace else run.source.spec, trace=trace,
                     users=run.load.users, length_scale=run.load.length_scale,
                     seed=spec.seed, attainment=attainment, sustain=sustain, model=model,
                     log=log,
                     warmup_requests=SIM_WARMUP_REQUESTS,
                     duration=run.load.duration)  # the real probes' window (sim_duration)
    source = "the target's served steps (Prometheus)" if profile.num_steps else "config.json"
    plan = CapacityPlan(sim=sim, sim_base=base, trials=spec.trials, source=source,
                        real_probes=max(2, params.max_probes if params else 4),
                        trace_rate=run.source.trace_rate, log=log, pool_from_pilot=True,
                        phase=lambda phase: run.publish(phase=phase))
    config = SweepConfig(workload=run.load.workload, slos=run.slos, primary_latency="ttft",
                         space=list(spec.space), load=run.load,
                         launch=TrialServiceLaunch(run, log), storage="", study_name="",
                         out_dir=run.out_dir, trials=spec.trials, objective="capacity",
                         remeasure=spec.candidates, confirm_rounds=spec.confirm_rounds,
                         baseline=baseline, min_gain=spec.min_gain, seed=spec.seed,
                         warmup_requests=spec.warmup_requests)
    return config, plan


def run_sweep(run, baseline, log) -> dict:
    """The capacity sweep's record (tuner.search.capacity_sweep.run_capacity_sweep) with
    `gains` and `decision` as tuner.incluster.apply reads them."""
    from tuner.search.capacity_sweep import run_capacity_sweep

    for name in run.cluster.trial_names():   # a restarted Job's leftovers
        run.cluster.delete_service(name, wait=True)
    config, plan = build(run, baseline, log)
    record = run_capacity_sweep(config, plan)
    record["gains"] = {a["label"]: a.get("gain") for a in record["arms"][1:]}
    record["decision"] = {"winner": record["winner"], "reason": record["reason"]}
    return record


def simulated_status(record: dict) -> dict[str, Any]:
    """status fields of the simulated search: its size, the baseline's and the best
    simulated capacities with their settings (spec.engine keys)."""
    points = {json.dumps(p["params"], sort_keys=True): p for p in record["simulated"]
              if p["capacity"] is not None}   # a repeated setting once
    ranked = sorted(points.values(), key=lambda p: -p["capacity"])
    shown = [{**to_spec_patch(p["params"], record=True), "capacity": round(p["capacity"], 4)}
             for p in ranked[:SIM_SHOWN]]
    return {"simulation": {"settings": len(record["simulated"]),
                           "infeasible": sum(p["capacity"] is None for p in record["simulated"]),
                           "wallSeconds": round(record["sim_wall_s"], 2),
                           "baselineCapacity": round(record["sim_baseline"], 4),
                           "profile": {k: v for k, v in record["profile"].items()
                                       if k in ("form", "source")}
                           | {"heldoutError": _finite(record["profile"]["heldout_error"])}
                           | _anchor_status(record["profile"].get("anchor")),
                           "best": shown}}


def pilot_status(record: dict) -> dict[str, Any]:
    """status.pilot: the baseline's pilot capacity (or why it failed), its ratio to the
    baseline's rounds' median and, where it drifted from them (capacity_sweep.pilot_drift),
    the warning that the simulator was fitted to a machine at another speed."""
    from tuner.search.capacity_sweep import drift_text

    pilot, drift = record["pilot"], record.get("pilot_drift")
    out: dict[str, Any] = {"capacity": round(pilot["capacity"], 4)}
    if pilot["failed"]:
        out["failed"] = pilot["failed"]
    if drift:
        out["ofBaselineRounds"] = round(drift["ratio"], 4)
        if drift["flagged"]:
            out["warning"] = drift_text(drift)
    return out


def _anchor_status(anchor: dict | None) -> dict[str, Any]:
    """The step times' factor that made the baseline's simulated capacity its pilot's."""
    if not anchor:
        return {}
    return {"anchor": {"factor": anchor["factor"], "pilotCapacity": round(anchor["pilot"], 4),
                       "simulatedBefore": round(anchor["simulated"], 4),
                       "tried": anchor.get("tried", [])}}


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def capacity_status(record: dict, attainment: float, *, label: str | None = None,
                    autoscaling: dict | None = None) -> dict[str, Any]:
    """status.capacity from the confirmation: the median real capacity per replica over
    the rounds of arm `label` (default: the winner, else the baseline); with the target's
    `autoscaling` (mode metrics), the autoscaler's target at that capacity."""
    arms = {a["label"]: a for a in record["arms"]}
    arm = arms[label or record["winner"] or "baseline"]
    rates = [c for c, failed in zip(arm["capacity"], arm["failed"]) if not failed]
    out = {"engine": to_spec_patch(arm["params"], record=True)["engine"],
           "ratePerReplica": round(statistics.median(rates), 4) if rates else 0.0,
           "rounds": len(rates), "attainment": attainment,
           # no rounds: the simulator rated nothing above the baseline, its pilot measured it
           "source": "confirmation" if record.get("rounds", 1) else "pilot"}
    if autoscaling and autoscaling.get("mode", "metrics") == "metrics" and rates:
        out["autoscaling"] = autoscaler_at_capacity(arm, autoscaling)
    return out


def confirmed_capacity(record: dict, attainment: float, autoscaling: dict | None):
    """apply_decision's `capacity(engine, start)` for the Capacity objective: the status
    of the arm the decision applies (engine {}: the baseline), from the confirmation;
    nothing more is measured."""
    return lambda engine, start, sections=None: capacity_status(
        record, attainment, label=None if engine else "baseline", autoscaling=autoscaling)


def autoscaler_at_capacity(arm: dict, autoscaling: dict) -> dict[str, Any]:
    """{metric, target} (tuner.incluster.load.autoscaler_target) from the gauge an arm's
    engines showed at their capacity: per round its mean during the highest passing
    probe, the median over the rounds."""
    from tuner.incluster.load import AUTOSCALER_FIGURES, autoscaler_target

    key = AUTOSCALER_FIGURES.get(autoscaling.get("metric") or "queueDepth", "")
    values = []
    for probes in arm["probes"]:   # a round that failed has none
        passed = [p for p in probes if p["passed"] and key in (p.get("gauges") or {})]
        if passed:
            values.append(max(passed, key=lambda p: p["rate"])["gauges"][key])
    return autoscaler_target(autoscaling, {key: statistics.median(values)} if values else {})


def verify_capacity(run, record: dict) -> dict[str, Any]:
    """The verification without PromQL: one open-loop probe (spec.trialDuration) on a
    live pod at the rate the gain promises, the baseline's median real capacity times the
    winner's lower bound (at least 1); held when its settled requests meet the SLOs at the
    target attainment. The pod serves its own traffic beside it, as in production."""
    from tuner.measure.capacity import SUSTAIN_SECONDS, probe_load, probe_verdict, rate_load
    from tuner.measure.scoring import load_samples
    from tuner.measure.trial import measure

    base = record["arms"][0]
    rates = [c for c, failed in zip(base["capacity"], base["failed"]) if not failed]
    low = record["gains"][record["winner"]]["low"]
    rate = statistics.median(rates) * max(low, 1.0)
    attainment = run.spec.capacity.attainment if run.spec.capacity else 0.9
    sustain = run.spec.capacity.sustain_seconds if run.spec.capacity else SUSTAIN_SECONDS
    workdir = run.out_dir / "verify"
    load = rate_load(probe_load(run.load, 999), rate, trace_rate=run.source.trace_rate)
    measure(run.cluster.endpoint_url(run.spec.target), load, run.slos, workdir=workdir,
            warmup_requests=run.spec.warmup_requests, prometheus=run.prometheus)
    verdict = probe_verdict(load_samples(workdir / "samples.jsonl"), run.slos, attainment,
                            sustain)
    share, settled, held = verdict["attainment"], verdict["requests"], verdict["passed"]
    return {"held": held, "rate": round(rate, 4), "attainment": round(share, 4),
            "requests": settled, "baselineCapacity": round(statistics.median(rates), 4),
            "message": f"verified on {run.spec.target} with a {run.spec.duration:g} s "
                       f"open-loop load at {rate:.3f} req/s (the baseline's capacity x the "
                       f"gain's lower bound): {share:.0%} of {settled} settled requests met "
                       f"the SLOs, {attainment:.0%} needed"
                       + ("" if held or share < attainment else
                          f"; but their queue grew faster than the pod holds for "
                          f"{sustain:g} s")}
