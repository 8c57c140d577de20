"""spec.autoscaling: who sets the engine Deployment's replicas.

- mode `metrics` (the default): an HPA on a per-pod engine metric (queue depth or KV
  usage), or KEDA's ScaledObject where KEDA is installed.
- mode `slo`: the SLO planner (tuner/planner/), a Deployment the operator owns, sets the
  replicas through the scale subresource from the service's traffic, its mix and the
  simulator's capacity per replica; it can go down to zero (`minReplicas: 0`).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from paged_api.fields import InvalidSpecError, get_field, positive, quantity, quantity_value

PROMETHEUS_URL = re.compile(r"^https?://[^\s/?#@]+(/[^\s]*)?$")
DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
AUTOSCALING_METRICS = {
    # spec value -> engine metric name (vLLM's), read per pod through the metrics pipeline
    "queueDepth": "vllm:num_requests_waiting",
    "kvCacheUsage": "vllm:kv_cache_usage_perc",
}
MODES = ("metrics", "slo")
FORECASTS = ("none", "holt")   # tuner/planner/forecast.py FORECASTS
SLO_KEYS = {"ttftSeconds": "ttft", "itlSeconds": "itl", "e2eSeconds": "e2e"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SloPlanner:
    """mode slo's settings (the planner's PlannerSpec, the SLOs, where it reads)."""
    slos: Mapping[str, float]            # {"ttft": s, "itl": s, "e2e": s}, at least one
    target_attainment: float = 0.9
    interval_seconds: int = 30
    scale_down_stabilization_seconds: int = 300
    idle_window_seconds: int = 600
    forecast: str = "none"
    startup_seconds: int = 0             # a new replica's cold start: the forecast's lead
    target_utilization: float = 0.9      # the share of its SLO capacity a replica is planned at
    selector: str | None = None          # PromQL matchers; None: the service's pods


@dataclasses.dataclass(frozen=True, kw_only=True)
class Autoscaling:
    min_replicas: int
    max_replicas: int
    metric: str            # a key of AUTOSCALING_METRICS
    target: str            # per-pod average, as a Kubernetes quantity string
    prometheus_server_address: str
    mode: str = "metrics"
    planner: SloPlanner | None = None    # set exactly when mode is slo


def _seconds(auto: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = positive(get_field(auto, key, "autoscaling.", int, default), f"autoscaling.{key}",
                     minimum=minimum)
    assert value is not None
    return value


def parse_planner(auto: Mapping[str, Any]) -> SloPlanner:
    slo = get_field(auto, "slo", "autoscaling.", dict, {})
    slos = {}
    for key, name in SLO_KEYS.items():
        value = get_field(slo, key, "autoscaling.slo.", (int, float))
        if value is not None:
            if value <= 0:
                raise InvalidSpecError(f"spec.autoscaling.slo.{key} must be > 0, got {value}")
            slos[name] = float(value)
    if not slos:
        raise InvalidSpecError("spec.autoscaling.mode slo needs spec.autoscaling.slo with at "
                               "least one of ttftSeconds, itlSeconds, e2eSeconds")
    attainment = get_field(auto, "targetAttainment", "autoscaling.", (int, float), 0.9)
    if not 0 < attainment <= 1:
        raise InvalidSpecError(f"spec.autoscaling.targetAttainment must be in (0, 1], "
                               f"got {attainment}")
    utilization = get_field(auto, "targetUtilization", "autoscaling.", (int, float), 0.9)
    if not 0 < utilization <= 1:
        raise InvalidSpecError(f"spec.autoscaling.targetUtilization must be in (0, 1], "
                               f"got {utilization}")
    forecast = get_field(auto, "forecast", "autoscaling.", str, "none")
    if forecast not in FORECASTS:
        raise InvalidSpecError(f"spec.autoscaling.forecast must be one of {list(FORECASTS)}, "
                               f"got {forecast!r}")
    return SloPlanner(
        slos=slos, target_attainment=float(attainment),
        target_utilization=float(utilization),
        interval_seconds=_seconds(auto, "intervalSeconds", 30, 5),
        scale_down_stabilization_seconds=_seconds(auto, "scaleDownStabilizationSeconds", 300, 0),
        idle_window_seconds=_seconds(auto, "idleWindowSeconds", 600, 0),
        forecast=forecast, startup_seconds=_seconds(auto, "startupSeconds", 0, 0),
        selector=get_field(auto, "selector", "autoscaling.", str))


def parse_autoscaling(auto: Mapping[str, Any] | None) -> Autoscaling | None:
    if not auto:
        return None
    mode = get_field(auto, "mode", "autoscaling.", str, "metrics")
    if mode not in MODES:
        raise InvalidSpecError(f"spec.autoscaling.mode must be one of {list(MODES)}, "
                               f"got {mode!r}")
    # zero replicas only where something brings one back: the planner
    lo = positive(get_field(auto, "minReplicas", "autoscaling.", int, 1),
                  "autoscaling.minReplicas", minimum=0 if mode == "slo" else 1)
    hi = get_field(auto, "maxReplicas", "autoscaling.", int)
    if hi is None:
        raise InvalidSpecError("spec.autoscaling.maxReplicas is required when autoscaling is set")
    assert lo is not None
    positive(hi, "autoscaling.maxReplicas")
    if hi < lo:
        raise InvalidSpecError(f"spec.autoscaling.maxReplicas ({hi}) must be >= "
                               f"spec.autoscaling.minReplicas ({lo})")
    metric = get_field(auto, "metric", "autoscaling.", str, "queueDepth")
    if metric not in AUTOSCALING_METRICS:
        raise InvalidSpecError(f"spec.autoscaling.metric must be one of "
                               f"{sorted(AUTOSCALING_METRICS)}, got {metric!r}")
    default_target = "5" if metric == "queueDepth" else "0.8"
    target = quantity(auto.get("target", default_target), "autoscaling.target")
    assert target is not None
    if metric == "kvCacheUsage" and not 0 < (quantity_value(target) or 0) <= 1:
        raise InvalidSpecError(f"spec.autoscaling.target for kvCacheUsage is a fraction in "
                               f"(0, 1], got {target}")
    address = get_field(auto, "prometheusServerAddress", "autoscaling.", str, DEFAULT_PROMETHEUS)
    if not PROMETHEUS_URL.match(address):
        # KEDA's operator (or the planner) calls this URL from its own place in the network.
        raise InvalidSpecError(f"spec.autoscaling.prometheusServerAddress must be an http:// "
                               f"or https:// URL without credentials, got {address!r}")
    return Autoscaling(min_replicas=lo, max_replicas=hi, metric=metric, target=target,
                       prometheus_server_address=address, mode=mode,
                       planner=parse_planner(auto) if mode == "slo" else None)
