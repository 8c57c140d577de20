"""The in-cluster tuning's load: where the workload comes from, and the capacity search.

- `workload_source`: spec.workload (a synthetic workload), or spec.workloadFrom:
  `trace.configMapRef` (the operator mounts the key as a file, $TUNER_TRACE_FILE),
  `trace.url` (fetched once into the out dir), or `prometheus` (lengths and rate fitted
  from the target's own histograms over `window`, tuner.sources.workload_source.from_prometheus;
  default selector: the target's pods). The non-synthetic sources come with a workload
  document (what was inferred, what was assumed) for the status and the recommendation.
- `with_opt_in`: the Job's search space with the workload's opt-in dimensions.
- `load_spec`: the LoadSpec and SLOs every measurement of the tuning uses, with
  spec.loadWorkers Locust workers (distributed mode; their samples merge into one set at
  the master, loadtests/distributed.py): the operator's load-worker pods, whose master
  listens on $TUNER_LOCUST_MASTER_PORT, or worker processes here when that is unset.
- `measure_capacity`: the highest open-loop load one replica with the winning settings
  takes within the SLOs (tuner.measure.capacity's search, each probe a trialDuration load on one
  trial service `<tuning>-cap`), and the autoscaler's target it implies: the value of the
  target's spec.autoscaling.metric (per pod) measured at that load.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from loadtests.workloads import TRACE_WORKLOAD, get_workload
from tuner.measure.capacity import SUSTAIN_SECONDS, probe_load, rate_load, search_capacity
from paged_api.contract import MASTER_PORT_ENV, TRACE_FILE_ENV, TuningSpec, search_space
from tuner.measure.loadgen import LoadError, LoadSpec
from tuner.measure.scoring import load_samples
from tuner.incluster.run import TuningRun
from tuner.incluster.service_runner import merge_patch, private_disk_tier
from tuner.measure.trial import measure
from tuner.sources.workload_source import WorkloadSource, from_prometheus, from_trace

def with_opt_in(tuning: TuningSpec, spec: dict[str, Any]) -> TuningSpec:
    """The Job's space: with spec.searchSpace unset, the named workload's tune_also joins
    the table's defaults (chat, the default, and rag: kv_offloading_size); a workload from
    workloadFrom adds none (its revisits are unknown). The operator's parse_tuning gives the
    defaults alone: its image holds the workloads' names, not their definitions."""
    if spec.get("searchSpace") is not None or tuning.workload_from is not None:
        return tuning
    also = get_workload(tuning.workload).tune_also
    return dataclasses.replace(tuning, space=search_space(None, also)) if also else tuning


MAX_TRACE_BYTES = 256 << 20   # a trace URL's body: ~2.5 million requests
# spec.autoscaling.metric -> the poller's per-pod mean during a probe (tuner.measure.server_metrics)
AUTOSCALER_FIGURES = {"queueDepth": "num_requests_waiting_mean",
                      "kvCacheUsage": "kv_cache_usage_perc_mean"}
MIN_TARGET = {"queueDepth": 0.1, "kvCacheUsage": 0.05}   # an HPA target must be > 0


def workload_source(spec: TuningSpec, *, namespace: str, out_dir: Path) -> WorkloadSource:
    """ValueError naming the field when the trace or the fit cannot be had."""
    wf = spec.workload_from
    if wf is None:
        return WorkloadSource(name=spec.workload, spec=get_workload(spec.workload))
    if wf.kind == "prometheus":
        selector = wf.selector or f'namespace="{namespace}",pod=~"{spec.target}-[^-]+-[^-]+"'
        try:
            return from_prometheus(spec.prometheus_url, window=wf.window, selector=selector,
                                   duration=spec.duration, seed=spec.seed, out_dir=out_dir)
        except (ValueError, OSError, LoadError) as exc:
            raise ValueError(f"spec.workloadFrom.prometheus: no workload could be fitted from "
                             f"{spec.prometheus_url} ({exc})") from None
    if wf.url is not None:
        path = out_dir / "trace.jsonl"
        try:
            with urllib.request.urlopen(wf.url, timeout=60) as response:
                data = response.read(MAX_TRACE_BYTES + 1)
            if len(data) > MAX_TRACE_BYTES:
                raise ValueError(f"larger than {MAX_TRACE_BYTES >> 20} MiB")
            path.write_bytes(data)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ValueError(f"spec.workloadFrom.trace.url: cannot fetch {wf.url} "
                             f"({exc})") from None
        where = f"trace.url {wf.url}"
    else:
        name, key = wf.config_map or ("", "")
        where = f"the ConfigMap {name!r} (key {key!r})"
        path = Path(os.environ.get(TRACE_FILE_ENV) or "/nonexistent")
        if not path.is_file() or not path.read_text(errors="replace").strip():
            raise ValueError(f"spec.workloadFrom.trace.configMapRef: {where} is missing or "
                             "empty: create it (the tuner reads it at its start)")
    try:
        source = from_trace(path)
    except ValueError as exc:
        raise ValueError(f"spec.workloadFrom.trace: {where}: {exc}") from None
    return WorkloadSource(name=source.name, spec=source.spec, trace=source.trace,
                          trace_rate=source.trace_rate,
                          document=(source.document or "").replace(f"trace {path}", where, 1))


def load_spec(spec: TuningSpec, source: WorkloadSource, *,
              model_name: str | None) -> tuple[LoadSpec, dict]:
    """The load of every measurement, and the SLOs it is scored against."""
    port = os.environ.get(MASTER_PORT_ENV)
    overrides = dict(spec.slo)
    slos = {kind: {**limits, **overrides} for kind, limits in source.spec.slos.items()}
    load = LoadSpec(
        workload=source.name, duration=spec.duration,
        users=spec.users or (1 if spec.rate else source.spec.users),
        arrival="open" if spec.rate else "closed", rate=spec.rate or 1.0, seed=spec.seed,
        length_scale=spec.length_scale, model_name=model_name, workers=spec.load_workers,
        master_port=int(port) if port and spec.load_workers > 1 else None,
        trace=str(source.trace) if source.trace is not None else None)
    return source.load(load), slos


def describe(spec: TuningSpec, source: WorkloadSource) -> dict[str, Any]:
    """status.workload: the load's source and, for a trace or a fit, its document."""
    wf = spec.workload_from
    out: dict[str, Any] = {"source": "workload" if wf is None else
                           f"workloadFrom.{wf.kind}", "name": spec.workload if wf is None
                           else TRACE_WORKLOAD, "loadWorkers": spec.load_workers}
    if source.trace_rate is not None:
        out["traceRate"] = round(source.trace_rate, 4)
    if source.document:
        out["document"] = source.document
    return out


def wants_capacity(spec: TuningSpec, target: dict) -> bool:
    """Asked for (spec.capacity), or needed: Auto applies the autoscaler's target too."""
    return spec.capacity is not None or (
        spec.mode == "Auto" and bool((target.get("spec") or {}).get("autoscaling")))


def autoscaler_target(autoscaling: dict, figures: dict) -> dict[str, Any]:
    """{metric, target} from the probe at capacity; {metric, reason} when not measured."""
    metric = autoscaling.get("metric") or "queueDepth"
    value = figures.get(AUTOSCALER_FIGURES.get(metric, ""))
    if value is None:
        return {"metric": metric, "reason": f"the engine reported no {metric} gauge at "
                "capacity: the autoscaler's target is left as it is"}
    value = max(float(value), MIN_TARGET.get(metric, 0.0))
    if metric == "kvCacheUsage":
        value = min(value, 1.0)
    # a plain decimal: a Kubernetes quantity the HPA takes, and a number KEDA's threshold takes
    return {"metric": metric, "target": format(round(value, 2), "g"),
            "measured": round(float(figures[AUTOSCALER_FIGURES[metric]]), 4)}


def measure_capacity(run: TuningRun, engine: dict, *, start: float,
                     sections: dict | None = None) -> dict[str, Any]:
    """status.capacity for `engine` (spec.engine keys) on one trial service, with the
    winner's settings of other sections merged in (`sections`: {"kvCache": {"offloadGiB":
    GiB or None}}) beside the target's disk tier, which becomes the service's own
    (private_disk_tier), as for a trial."""
    params = run.spec.capacity
    max_probes = params.max_probes if params else 6
    attainment = params.attainment if params else 0.9
    sustain = params.sustain_seconds if params else SUSTAIN_SECONDS
    name = f"{run.name}-cap"
    settings = {**run.target_engine, **engine}
    spec = merge_patch(run.target["spec"], sections) if sections else run.target["spec"]
    spec = private_disk_tier(spec)
    run.cluster.create_trial(name, {**run.target, "spec": spec}, settings, run.owner)
    figures_at: dict[float, dict] = {}
    numbers = itertools.count()
    try:
        run.cluster.wait_ready(name, timeout=run.spec.startup_timeout)
        url = run.cluster.endpoint_url(name)

        def probe(rate: float) -> Any:
            k = next(numbers)
            workdir = run.out_dir / "capacity" / f"probe-{k:02d}"
            load = rate_load(probe_load(run.load, k), rate, trace_rate=run.source.trace_rate)
            figures_at[rate] = measure(url, load, run.slos, workdir=workdir,
                                       warmup_requests=0, prometheus=run.prometheus)
            return load_samples(workdir / "samples.jsonl")

        result = search_capacity(probe, run.slos, start=start, attainment=attainment,
                                 max_probes=max_probes, sustain=sustain)
    finally:
        run.cluster.delete_service(name, wait=True)
    out: dict[str, Any] = {
        "engine": settings, "ratePerReplica": round(result.rate, 4),
        "upper": None if result.upper is None else round(result.upper, 4),
        "attainment": attainment, "text": result.line(),
        "probes": [{**p, "rate": round(p["rate"], 4), "attainment": round(p["attainment"], 4)}
                   for p in result.probes]}
    autoscaling = (run.target.get("spec") or {}).get("autoscaling")
    if autoscaling and result.rate > 0:
        out["autoscaling"] = autoscaler_target(autoscaling, figures_at[result.rate])
    return out
