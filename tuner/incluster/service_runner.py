"""The TrialRunner of the in-cluster tuning Job: a trial PagedInferenceService.

Each request creates a PagedInferenceService owned by the tuning resource: the target's
spec with one replica and `spec.engine` = the target's engine settings overlaid with the
trial's (the only place the settings become CRD fields); a setting that lives outside
spec.engine goes to its own place (kv_offloading_size: spec.kvCache.offloadGiB, beside the
target's disk tier; off removes it). A disk tier on the target's claim becomes the trial's
own emptyDir of the same size (private_disk_tier). It waits for Ready (Degraded is
infeasible, with the engine's own message), drives the load at the service's ready address,
reads the figures (PromQL with spec.prometheus.url, else /metrics) and deletes the service.
A request's name makes the service's: `<tuning>-t3` for search trial 3,
`<tuning>-r1-c1` for confirmation round 1's candidate C1.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable

from tuner.incluster.cluster import Cluster
from tuner.measure.loadgen import LoadSpec
from tuner.measure.promql import PrometheusReader
from tuner.measure.runner import TrialRequest
from tuner.measure.trial import measure
from paged_api.search_space import to_spec_patch


def service_name(tuning: str, request_name: str) -> str:
    """`trial-0003` -> `<tuning>-t3`; `round-1-C1` -> `<tuning>-r1-c1`."""
    found = re.fullmatch(r"trial-0*(\d+)", request_name)
    if found:
        return f"{tuning}-t{found[1]}"
    found = re.fullmatch(r"round-(\d+)-(\w+)", request_name)
    if found:
        return f"{tuning}-r{found[1]}-{found[2].lower()}"
    raise ValueError(f"no trial service name for request {request_name!r}")


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as `kubectl patch --type merge` applies the result: objects merge key by
    key, None removes (a trial with numSpeculativeTokens 0 drops the target's speculative)."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):  # onto {} when the target has none (nulls dropped)
            out[key] = merge_patch(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


def private_disk_tier(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with a disk KV tier on a claim moved to an emptyDir of the same size: the
    claim may be ReadWriteOnce (attached where the live pods run), and a shared directory
    would carry the live service's blocks, and each trial's, into the trials after it."""
    kv = spec.get("kvCache")
    disk = kv.get("disk") if isinstance(kv, dict) else None
    if not isinstance(disk, dict) or "persistentVolumeClaim" not in (disk.get("volume") or {}):
        return spec
    return {**spec, "kvCache": {**kv, "disk": {**disk, "volume": {"emptyDir": {}}}}}


def create_trial_service(cluster: Cluster, name: str, target: dict, settings: dict,
                         owner: dict) -> None:
    """The trial PagedInferenceService `name`: the target's spec with these settings
    (engine args, and the sections they name: spec.kvCache's host tier) merged in, its
    disk tier its own (private_disk_tier)."""
    patch = to_spec_patch(settings)
    engine = merge_patch(dict(target["spec"].get("engine") or {}), patch.pop("engine"))
    cluster.create_trial(name, {**target, "spec": private_disk_tier(
        merge_patch(target["spec"], patch))}, engine, owner)


@dataclass
class ServiceRunner:
    """Measures each trial on a fresh trial PagedInferenceService (see the module's doc)."""

    cluster: Cluster
    tuning: str                  # the PagedInferenceTuning's name
    owner: dict                  # its owner reference (trials are deleted with it)
    target: dict                 # the target PagedInferenceService
    load: LoadSpec
    slos: dict
    startup_timeout: float
    warmup_requests: int = 2
    prometheus: PrometheusReader | None = None
    log: Callable[[str], None] = print

    @property
    def target_engine(self) -> dict[str, Any]:
        return dict(self.target["spec"].get("engine") or {})

    def run(self, request: TrialRequest) -> dict[str, float]:
        name = service_name(self.tuning, request.name)
        create_trial_service(self.cluster, name, self.target, request.settings, self.owner)
        stopping = self.cluster.stopping

        def on_progress(elapsed: float, goodput: float) -> bool:
            if stopping.is_set():
                return True
            return bool(request.on_progress and request.on_progress(elapsed, goodput))

        try:
            self.cluster.wait_ready(name, timeout=self.startup_timeout)
            url = self.cluster.endpoint_url(name)
            self.log(f"{name}: ready at {url}, {self.load.duration:g} s of {self.load.workload}")
            return measure(url, dataclasses.replace(self.load, seed=request.seed), self.slos,
                           workdir=request.workdir, warmup_requests=self.warmup_requests,
                           prometheus=self.prometheus, progress_interval=0.5,
                           on_progress=on_progress)
        finally:
            self.cluster.delete_service(name, wait=True)
