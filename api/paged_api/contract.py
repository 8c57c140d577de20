"""The contract between the operator and the tuner Job: one torch-free module.

What both sides must agree on, and nothing else: the API group, version, kinds and
plurals; the labels and annotations one writes and the other reads; the environment
variables and files the operator gives the Job's pods; and the PagedInferenceTuning spec,
parsed once into a `TuningSpec` with the error messages both show (the operator as the
SpecValid condition before any Job starts, the Job as status.decision when it does).
docs/INTERFACES.md ("Operator and tuner Job") describes the same for people.

It lives in the API package beside the settings table and the search-space grammar it
reads, all torch-free: the operator image copies that package (tests/engine/test_settings.py
parses a tuning with nothing else importable).

Names follow the CRD (camelCase); `searchSpace` keys are the table's rows by their key in
their section (spec.engine's blockSize, spec.kvCache's offloadGiB), so the CRD, the tuner
and the engine agree. A value is a list of choices or a range `{min, max, log, step}`. Errors are ValueErrors naming
the field to change.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from paged_api.workloads import WORKLOAD_NAMES
from paged_api.search_space import DEFAULT_SPACE, SETTINGS, Param, SpaceError, parse_param

# ---- the API ----
GROUP = "serving.pagedinference.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
SERVICE_KIND = "PagedInferenceService"
SERVICE_PLURAL = "pagedinferenceservices"
TUNING_KIND = "PagedInferenceTuning"
TUNING_PLURAL = "pagedinferencetunings"

# ---- labels and annotations ----
MANAGED_BY = "paged-inference-operator"      # app.kubernetes.io/managed-by of every child
TUNING_LABEL = f"{GROUP}/tuning"             # on a trial service: the tuning that owns it
PREVIOUS_ENGINE = f"{GROUP}/previous-engine"  # on a target Auto changed: what it changed, before
# (JSON: {"engine": ..., "autoscaling": {"target"}?, "kvCache": {"offloadGiB"} or null?})
APPLIED_BY = f"{GROUP}/applied-by"            # ... and the tuning that changed it
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"   # a tuner pod's index (tunerPods)

# ---- what the operator gives the Job's pods ----
API_KEY_FILE_ENV = "TUNER_API_KEY_FILE"      # the target's API key, mounted from its Secret
TRACE_FILE_ENV = "TUNER_TRACE_FILE"          # spec.workloadFrom.trace.configMapRef, mounted
STORAGE_URL_ENV = "TUNER_STORAGE_URL"        # spec.storage.secretRef's URL (Optuna RDB)
MASTER_PORT_ENV = "TUNER_LOCUST_MASTER_PORT"  # load workers are pods (spec.loadWorkers > 1)
INDEX_ENV = "JOB_COMPLETION_INDEX"           # set by Kubernetes in an Indexed Job

MODES = ("Manual", "Auto")
OBJECTIVES = ("Goodput", "Capacity")
DEFAULT_WORKLOAD = "chat"       # when neither workload nor workloadFrom is given
# spec.engine key -> setting
BY_KEY = {s.field: name for name, s in SETTINGS.items() if s.field and s.section == "engine"}
# spec.searchSpace key -> setting: every searchable row by its key in its section (blockSize
# of spec.engine, offloadGiB of spec.kvCache: the host KV tier's size)
SEARCH_KEYS = {s.field: name for name, s in SETTINGS.items() if s.field}
# PagedInferenceService names are at most 52 characters; trial names add "-r9-baseline"
MAX_NAME = 38


@dataclass(frozen=True)
class WorkloadFrom:
    """spec.workloadFrom: `trace` (config_map (name, key) or url) or `prometheus`."""
    kind: str                                # "trace" | "prometheus"
    config_map: tuple[str, str] | None = None
    url: str | None = None
    window: str = "24h"                      # prometheus: the window to fit over
    selector: str | None = None              # prometheus: label matchers; None: the target's


@dataclass(frozen=True)
class CapacitySpec:
    """spec.capacity: the rate search on the winning settings (tuner.measure.capacity)."""
    max_probes: int = 6
    attainment: float = 0.9
    sustain_seconds: float = 60.0   # how long a passing rate's queue must hold


@dataclass(frozen=True)
class TuningSpec:
    target: str
    workload: str
    space: tuple[Param, ...]
    trials: int = 24
    parallelism: int = 1
    duration: float = 120.0         # seconds of load per measurement
    users: int | None = None        # closed loop; None: the workload's
    rate: float | None = None       # open loop instead (requests/s)
    slo: tuple[tuple[str, float], ...] = ()   # (ttft|tpot|e2e, seconds) overrides
    length_scale: float = 1.0
    warmup_requests: int = 2
    confirm_rounds: int = 3
    candidates: int = 1
    prometheus_url: str | None = None
    mode: str = "Manual"
    min_gain: float = 1.0
    verify_window: float = 300.0    # Auto with prometheus_url: PromQL on the live traffic
    startup_timeout: float = 600.0
    seed: int = 0
    workload_from: WorkloadFrom | None = None
    load_workers: int = 1
    capacity: CapacitySpec | None = None     # None: only for Auto on an autoscaled target
    tuner_pods: int = 1             # pods sharing the study (spec.storage's database)
    objective: str = "Goodput"      # Capacity: searched on the simulator (capacity_job.py)


def parse_duration(value: Any, field: str) -> float:
    """`120`, `"120s"`, `"2m"`, `"1.5m"` -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*", str(value))
        if not found:
            raise ValueError(f"spec.{field}: {value!r} is not a duration such as 120s or 2m")
        seconds = float(found[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}[found[2]]
    if seconds <= 0:
        raise ValueError(f"spec.{field} must be positive, got {value!r}")
    return seconds


def _number(spec: dict, field: str, kind: type, default: Any, *, low: float) -> Any:
    value = spec.get(field, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (kind is int and float(value) != int(value)):
        raise ValueError(f"spec.{field}: expected {kind.__name__}, got {value!r}")
    if value < low:
        raise ValueError(f"spec.{field} must be at least {low:g}, got {value!r}")
    return kind(value)


def search_space(space: Any, also: tuple[str, ...] = ()) -> tuple[Param, ...]:
    """`{blockSize: [16, 32], maxNumSeqs: {min: 8, max: 512, log: true}, offloadGiB: [0, 2]}`
    -> Params. Unset: the settings table's default ranges (each setting's `tune`: block
    size, memory fraction, maxNumSeqs, maxNumBatchedTokens), with those of `also` (the
    workload's tune_also, which the Job adds: tuner.incluster.load.job_space; the
    operator image holds the workloads' names only), as `python -m tuner sweep` searches."""
    if space is None:
        specs = dict(DEFAULT_SPACE) | {name: SETTINGS[name].tune for name in also}
        return tuple(parse_param(name, spec) for name, spec in specs.items())
    if not isinstance(space, dict) or not space:
        raise ValueError("spec.searchSpace: give at least one engine setting, e.g. "
                         "{maxNumSeqs: {min: 8, max: 256, log: true}}")
    out = []
    for key, value in space.items():
        if key not in SEARCH_KEYS:
            raise ValueError(f"spec.searchSpace.{key}: unknown engine setting; known: "
                             f"{', '.join(SEARCH_KEYS)}")
        if isinstance(value, dict):
            unknown = set(value) - {"min", "max", "log", "step"}
            if unknown or not {"min", "max"} <= set(value):
                raise ValueError(f"spec.searchSpace.{key}: a range is {{min, max, log, step}}")
            value = {"low": value["min"], "high": value["max"],
                     **{k: value[k] for k in ("log", "step") if k in value}}
        elif not isinstance(value, list):
            raise ValueError(f"spec.searchSpace.{key}: expected a list of values or "
                             "{min, max, log, step}")
        try:
            param = parse_param(SEARCH_KEYS[key], value)
        except SpaceError as exc:
            raise ValueError(f"spec.searchSpace.{key}: {exc}") from None
        if param is not None:
            out.append(param)
    return tuple(out)


def workload_from(spec: dict[str, Any]) -> WorkloadFrom | None:
    """spec.workloadFrom, checked against spec.workload and spec.prometheus.url."""
    given = spec.get("workloadFrom")
    if given is None:
        return None
    if spec.get("workload") is not None:
        raise ValueError("spec.workload and spec.workloadFrom: give one (a named workload, or "
                         "where to take the workload from), not both")
    if not isinstance(given, dict) or len({"trace", "prometheus"} & set(given)) != 1 \
            or set(given) - {"trace", "prometheus"}:
        raise ValueError("spec.workloadFrom: give exactly one of trace: {configMapRef: "
                         "{name, key}} or {url}, or prometheus: {window}")
    if "prometheus" in given:
        prom = given["prometheus"] or {}
        if not (spec.get("prometheus") or {}).get("url"):
            raise ValueError("spec.workloadFrom.prometheus needs spec.prometheus.url: the "
                             "Prometheus that scrapes the target's engines")
        window = str(prom.get("window") or "24h")
        try:
            parse_duration(window, "workloadFrom.prometheus.window")
        except ValueError:
            raise ValueError(f"spec.workloadFrom.prometheus.window: {window!r} is not a "
                             "duration such as 30m, 24h or 7d") from None
        return WorkloadFrom("prometheus", window=window.strip(),
                            selector=prom.get("selector") or None)
    trace = given["trace"] or {}
    ref, url = trace.get("configMapRef"), trace.get("url")
    if (ref is None) == (url is None):
        raise ValueError("spec.workloadFrom.trace: give configMapRef: {name, key} or url, "
                         "one of them")
    if url is not None:
        if not re.match(r"^https?://", str(url)):
            raise ValueError(f"spec.workloadFrom.trace.url: {url!r} is not an http(s) URL")
        return WorkloadFrom("trace", url=str(url))
    if not isinstance(ref, dict) or not ref.get("name"):
        raise ValueError("spec.workloadFrom.trace.configMapRef.name: name the ConfigMap "
                         "holding the trace")
    return WorkloadFrom("trace", config_map=(ref["name"], ref.get("key") or "trace.jsonl"))


def tuner_pods(spec: dict[str, Any]) -> int:
    """spec.tunerPods (default 1): more than one share a study, which SQLite in a pod
    cannot hold."""
    pods = _number(spec, "tunerPods", int, 1, low=1)
    if pods > 1 and not ((spec.get("storage") or {}).get("secretRef") or {}).get("name"):
        raise ValueError(f"spec.tunerPods {pods} needs spec.storage.secretRef: the pods "
                         "share one Optuna study in that database (PostgreSQL)")
    return pods


def objective_of(spec: dict[str, Any]) -> str:
    """spec.objective (default Goodput). Capacity searches the rate itself, on the
    simulator in one pod: no spec.rate, no second tuner pod."""
    objective = spec.get("objective") or "Goodput"
    if objective not in OBJECTIVES:
        raise ValueError(f"spec.objective: {objective!r} is not Goodput or Capacity")
    if objective == "Capacity" and spec.get("rate") is not None:
        raise ValueError("spec.rate: the Capacity objective searches the rate itself; drop "
                         "spec.rate (or use spec.objective Goodput for one fixed rate)")
    if objective == "Capacity" and (spec.get("tunerPods") or 1) > 1:
        raise ValueError("spec.tunerPods: the Capacity objective searches on the simulator "
                         "in one pod; set tunerPods to 1")
    return objective


def verify_window(spec: dict[str, Any]) -> float:
    """spec.apply.verifyWindow (default 5m), which only a Prometheus can read."""
    given = (spec.get("apply") or {}).get("verifyWindow")
    if given is not None and not (spec.get("prometheus") or {}).get("url"):
        raise ValueError("spec.apply.verifyWindow needs spec.prometheus.url: the live "
                         "service's traffic is read from Prometheus")
    return parse_duration("5m" if given is None else given, "apply.verifyWindow")


def parse_tuning(spec: dict[str, Any]) -> TuningSpec:
    target = (spec.get("targetRef") or {}).get("name")
    if not target:
        raise ValueError("spec.targetRef.name: name the PagedInferenceService to tune")
    source = workload_from(spec)
    workload = spec.get("workload") or DEFAULT_WORKLOAD
    if workload not in WORKLOAD_NAMES:
        raise ValueError(f"spec.workload: {workload!r} is not one of {', '.join(WORKLOAD_NAMES)}")
    slo = []
    for field, name in (("ttftSeconds", "ttft"), ("itlSeconds", "tpot"), ("e2eSeconds", "e2e")):
        value = (spec.get("slo") or {}).get(field)
        if value is not None:
            slo.append((name, _number(spec["slo"], field, float, None, low=1e-6)))
    apply = spec.get("apply") or {}
    mode = apply.get("mode", "Manual")
    if mode not in MODES:
        raise ValueError(f"spec.apply.mode: {mode!r} is not Manual or Auto")
    confirm = spec.get("confirm") or {}
    rounds = _number(confirm, "rounds", int, 3, low=2)
    if spec.get("users") is not None and spec.get("rate") is not None:
        raise ValueError("spec.users and spec.rate: give one (closed or open loop), not both")
    objective = objective_of(spec)
    capacity = spec.get("capacity")
    if capacity is not None:
        if not isinstance(capacity, dict):
            raise ValueError("spec.capacity: expected {maxProbes, attainment, sustainSeconds}")
        attainment = _number(capacity, "attainment", float, 0.9, low=1e-6)
        if attainment > 1:
            raise ValueError(f"spec.capacity.attainment is a share in (0, 1], got {attainment}")
        sustain = _number(capacity, "sustainSeconds", float, 60.0, low=0.0)
        if sustain > 3600:
            raise ValueError(f"spec.capacity.sustainSeconds: at most 3600, got {sustain}")
        capacity = CapacitySpec(max_probes=_number(capacity, "maxProbes", int, 6, low=1),
                                attainment=attainment, sustain_seconds=sustain)
    return TuningSpec(
        target=target, workload=workload, space=search_space(spec.get("searchSpace")),
        trials=_number(spec, "trials", int, 24, low=1),
        parallelism=_number(spec, "parallelism", int, 1, low=1),
        duration=parse_duration(spec.get("trialDuration", "120s"), "trialDuration"),
        users=_number(spec, "users", int, None, low=1),
        rate=_number(spec, "rate", float, None, low=1e-6), slo=tuple(slo),
        length_scale=_number(spec, "lengthScale", float, 1.0, low=1e-3),
        warmup_requests=_number(spec, "warmupRequests", int, 2, low=0),
        confirm_rounds=rounds, candidates=_number(confirm, "candidates", int, 1, low=1),
        prometheus_url=(spec.get("prometheus") or {}).get("url") or None,
        mode=mode, min_gain=_number(apply, "minGain", float, 1.0, low=0),
        verify_window=verify_window(spec),
        startup_timeout=parse_duration(spec.get("startupTimeout", "600s"), "startupTimeout"),
        seed=_number(spec, "seed", int, 0, low=0), workload_from=source,
        load_workers=_number(spec, "loadWorkers", int, 1, low=1), capacity=capacity,
        tuner_pods=tuner_pods(spec), objective=objective)


def spec_error(spec: dict[str, Any]) -> str | None:
    """Why a PagedInferenceTuning spec cannot run (the message names the field to change),
    or None: the operator's SpecValid condition, the same words as the Job's."""
    try:
        parse_tuning(spec)
    except ValueError as exc:
        return str(exc)
    return None
