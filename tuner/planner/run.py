"""`python -m tuner plan --name SVC`: the SLO planner of one PagedInferenceService.

The operator runs it as the Deployment `<SVC>-planner` when spec.autoscaling.mode is slo
(operator/paged_operator/manifests_planner.py, whose Role allows exactly the calls of
`ServiceScale`). Every spec.autoscaling.intervalSeconds it reads the service, observes the
last interval in Prometheus (spec.autoscaling.prometheusServerAddress, the service's pods
by spec.autoscaling.selector), decides (tuner/planner/core.py), sets the engine
Deployment's replicas through the scale subresource when they change, and writes the
decision to status.planner, the Planning condition and an Event. A changed spec.autoscaling or spec.engine starts
a new planner (the old smoothing and stabilisation belonged to other settings).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from paged_api.conditions import PLANNER_TYPE, condition, others
from paged_api.contract import GROUP, SERVICE_KIND, SERVICE_PLURAL, VERSION
from paged_api.service import InvalidSpecError, ServiceSpec, parse_spec
from tuner.measure.promql import PrometheusReader
from tuner.planner.core import Decision, Observation, Planner, PlannerSpec
from tuner.planner.metrics import PlannerMetrics
from tuner.planner.observe import Step

MERGE = "application/merge-patch+json"
WINDOW_FACTOR = 2   # the observation window, in intervals: a 15-s scrape needs > 1 point
WAKE_POLL = 1.0     # s between looks at the routers' held requests while at zero replicas


def planner_spec(spec: ServiceSpec) -> PlannerSpec:
    auto = spec.autoscaling
    assert auto is not None and auto.planner is not None
    p = auto.planner
    return PlannerSpec(min_replicas=auto.min_replicas, max_replicas=auto.max_replicas,
                       target_attainment=p.target_attainment, interval=p.interval_seconds,
                       scale_down_stabilization=p.scale_down_stabilization_seconds,
                       idle_window=p.idle_window_seconds, forecast=p.forecast,
                       startup=p.startup_seconds, utilisation=p.target_utilization)


def selector(spec: ServiceSpec) -> str:
    """The service's engine pods (pod names: <name>-<replicaset hash>-<pod hash>)."""
    auto = spec.autoscaling
    assert auto is not None and auto.planner is not None
    return auto.planner.selector or f'namespace="{spec.namespace}",pod=~"{spec.name}-[^-]+-[^-]+"'


def sim_predictor(spec: ServiceSpec):
    """One replica's capacity from the simulator: the profile of the service's model (a
    cached calibration, else none: tuner/sim/calibrate.config_profile) refitted to the
    service's own steps as Prometheus has them, the engines' KV pool, the service's engine
    settings and SLOs. Until a fit exists the planner holds the replicas, saying why."""
    from paged_api import settings_k8s
    from tuner.planner.predict import LiveSteps, SimPredictor
    from tuner.sim.calibrate import config_profile
    from tuner.sim.context import SimContext, engine_threads, load_profile

    auto = spec.autoscaling
    assert auto is not None and auto.planner is not None
    settings = settings_k8s.from_spec(spec.engine.applied())
    threads = engine_threads(settings)
    try:   # a cached calibration of the model; never one run here (config_profile)
        profile = load_profile(spec.model.engine_arg, threads, calibrate=False)
    except ValueError:
        profile = config_profile(spec.model.engine_arg, threads)
    # acceptance 0: the planner runs no model, so no replies to replay a speculative
    # method on (tuner/sim/drafts.py); its drafts are simulated as verified and rejected
    ctx = SimContext(profile=profile, slos=dict(auto.planner.slos), model=profile.identity.model,
                     attainment=auto.planner.target_attainment, acceptance=0.0,
                     duration=PLANNER_SIM_DURATION)
    live = LiveSteps(PrometheusReader(auto.prometheus_server_address, timeout=30),
                     selector(spec))
    return SimPredictor(ctx, settings, live=live)


# virtual seconds per simulated load: a replica's capacity under traffic sustained for a
# planning interval and more, not over a sweep's 10-s probe (a short window lets a rate past
# capacity pass while its queue builds: tuner/search/capacity_cli.sim_duration)
PLANNER_SIM_DURATION = 60.0


class ServiceScale:
    """The planner's calls on the cluster, through the official client."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.ns, self.name = namespace, name
        self.custom, self.apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
        self.core, self.discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
        self._last_event: client.CoreV1Event | None = None   # folded into when repeated

    def service(self) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns,
                                                        SERVICE_PLURAL, self.name)

    def replicas(self) -> int:
        scale = self.apps.read_namespaced_deployment_scale(self.name, self.ns)
        return int(scale.spec.replicas or 0)

    def scale(self, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(self.name, self.ns,
                                                    {"spec": {"replicas": replicas}})

    def record(self, obj: dict, decision: Decision, obs: Observation | None,
               previous: int) -> None:
        """status.planner, the Planning condition (False while the planner holds, saying
        why) and an Event; the same Event again only counts up (as kubectl's are folded)."""
        held = decision.reason.startswith("unchanged: ")
        planner = {k: v for k, v in asdict(decision).items() if v is not None}
        planner.update(time=_now(), previousReplicas=previous, held=held)
        if obs is not None:
            planner["observed"] = {k: v for k, v in asdict(obs).items()
                                   if v is not None and k != "at"}
        reason = "PlannerHeld" if held else (
            "PlannerScaled" if decision.replicas != previous else "PlannerKept")
        self._write_status(obj, planner, not held, reason, decision.reason)
        self._event(obj, reason, "Warning" if held else "Normal",
                    f"replicas {previous} -> {decision.replicas}: {decision.reason}"[:1024])

    def _write_status(self, obj: dict, planner: dict, ok: bool, reason: str,
                      message: str) -> None:
        """The whole conditions list is written (a merge patch replaces lists), so the write
        is conditional on the resourceVersion read: on a conflict (the operator wrote its
        conditions meanwhile) the service is read again and the write retried."""
        for attempt in range(3):
            status = obj.get("status") or {}
            previous = status.get("conditions") or []
            conditions = [*others(previous, [PLANNER_TYPE]), condition(
                PLANNER_TYPE, ok, reason, message[:1024],
                generation=obj["metadata"].get("generation"), previous=previous)]
            try:
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, self.ns, SERVICE_PLURAL, self.name,
                    {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     "status": {"planner": planner, "conditions": conditions}},
                    _content_type=MERGE)
                return
            except ApiException as e:
                if e.status != 409 or attempt == 2:
                    raise
                obj = self.service()

    def _event(self, obj: dict, reason: str, type_: str, message: str) -> None:
        last = self._last_event
        if last is not None and (last.reason, last.message) == (reason, message):
            last.count = (last.count or 1) + 1
            try:
                self.core.patch_namespaced_event(last.metadata.name, self.ns, {
                    "count": last.count, "lastTimestamp": _now()})
                return
            except ApiException as e:   # expired (events live an hour) or deleted
                if e.status != 404:
                    raise
        self._last_event = self.core.create_namespaced_event(self.ns, {
            "metadata": {"generateName": f"{self.name}.", "namespace": self.ns},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": SERVICE_KIND,
                               "name": self.name, "namespace": self.ns,
                               "uid": obj["metadata"].get("uid")},
            "reason": reason, "type": type_, "message": message,
            "source": {"component": "paged-inference-planner"},
            "firstTimestamp": _now(), "lastTimestamp": _now(), "count": 1})

    def router_urls(self) -> list[str]:
        """Every router pod behind the service's Service (which selects the router pods
        when spec.router is on): the addresses its EndpointSlices list as serving, on the
        port named http."""
        found = self.discovery.list_namespaced_endpoint_slice(
            self.ns, label_selector=f"kubernetes.io/service-name={self.name}").items
        urls = []
        for piece in found:
            port = next((p.port for p in piece.ports or [] if p.name == "http"), None)
            if port is None:
                continue
            for endpoint in piece.endpoints or []:
                cond = endpoint.conditions
                if cond is not None and (cond.serving if cond.serving is not None
                                         else cond.ready) is False:
                    continue
                for address in endpoint.addresses[:1]:   # one pod, one address
                    host = f"[{address}]" if ":" in address else address
                    urls.append(f"http://{host}:{port}")
        return sorted(urls)

    def router_held(self, spec: ServiceSpec) -> int:
        """Requests the service's routers hold for a first replica: the sum over every
        router pod's /metrics (each holds its own); 0 without a router."""
        if not spec.router.enabled:
            return 0
        return sum(held_at(url) for url in self.router_urls())


def held_at(router_url: str) -> int:
    """paged_router_held_requests on the router at `router_url`; 0 without an answer."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        text = httpx.get(router_url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0
    return int(sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples
                   if sample.name == "paged_router_held_requests"))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Loop:
    """One service's planner: `tick()` is one interval's decision."""

    def __init__(self, cluster: ServiceScale, *, predictor_for: Callable = sim_predictor,
                 held: Callable[[ServiceSpec], int] | None = None,
                 clock: Callable[[], float], metrics: PlannerMetrics | None = None) -> None:
        self.cluster, self.predictor_for, self.clock = cluster, predictor_for, clock
        self.held, self.metrics = held or cluster.router_held, metrics
        self.step: Step | None = None
        self.key: str | None = None
        self.interval = 30.0
        self.spec: ServiceSpec | None = None
        self.replicas: int | None = None   # as the last tick left them

    def _step_for(self, obj: dict) -> tuple[ServiceSpec, Step]:
        spec = parse_spec(obj.get("spec") or {}, name=self.cluster.name, namespace=self.cluster.ns)
        if spec.autoscaling is None or spec.autoscaling.mode != "slo":
            raise InvalidSpecError("spec.autoscaling.mode is not slo: nothing to plan")
        key = json.dumps([obj["spec"].get("autoscaling"), obj["spec"].get("engine")],
                         sort_keys=True)
        if self.step is None or key != self.key:
            pspec = planner_spec(spec)
            reader = PrometheusReader(spec.autoscaling.prometheus_server_address, timeout=30)
            self.step = Step(Planner(pspec), reader, selector(spec), self.predictor_for(spec),
                             window=WINDOW_FACTOR * pspec.interval)
            self.key, self.interval = key, pspec.interval
        return spec, self.step

    def tick(self) -> Decision:
        obj = self.cluster.service()
        spec, step = self._step_for(obj)
        previous = self.cluster.replicas()
        if previous == 0:   # no series in Prometheus then: the router's queue decides
            held = self.held(spec)
            decision = step.planner.wake(self.clock(), held) if held else Decision(
                at=self.clock(), replicas=0, wanted=0,
                reason="no replica serves and the router holds no request: zero stays")
            obs = None
        else:
            decision, obs = step(at=self.clock(), replicas=previous)
        if decision.replicas != previous:
            self.cluster.scale(decision.replicas)
        self.cluster.record(obj, decision, obs, previous)
        if self.metrics is not None:
            self.metrics.record(decision, previous)
        self.spec, self.replicas = spec, decision.replicas
        return decision

    def pause(self, stop: threading.Event) -> bool:
        """Wait until the next tick is due; True when `stop` was set. At zero replicas the
        routers are asked every WAKE_POLL s and a held request ends the wait at once: a
        cold start should not also wait out the interval (bench_planner.py: with a 15-s
        interval, up to 15 s more TTFT and that many more requests past the hold's bound)."""
        if self.replicas != 0 or self.spec is None:
            return stop.wait(self.interval)
        for _ in range(max(1, math.ceil(self.interval / WAKE_POLL))):
            if stop.wait(WAKE_POLL):
                return True
            try:
                if self.held(self.spec):
                    return False
            except (ApiException, OSError):
                pass   # the interval's tick will look again
        return False


def main(argv: list[str] | None = None) -> int:
    import time

    from tuner.incluster.cluster import current_namespace, load_client

    parser = argparse.ArgumentParser(prog="python -m tuner plan",
                                     description="The SLO planner of one PagedInferenceService.")
    parser.add_argument("--name", required=True, help="the PagedInferenceService")
    parser.add_argument("--namespace", default=None, help="default: this pod's")
    parser.add_argument("--once", action="store_true", help="one decision, then exit")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve the decisions' series (paged_planner_*) on this port")
    args = parser.parse_args(argv)
    cluster = ServiceScale(load_client(), args.namespace or current_namespace(), args.name)
    metrics = PlannerMetrics(cluster.ns, args.name)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server
        start_http_server(args.metrics_port, registry=metrics.registry)
    loop, stop = Loop(cluster, clock=time.time, metrics=metrics), threading.Event()
    while True:
        try:
            decision = loop.tick()
            print(f"{args.name}: {decision.replicas} replica(s): {decision.reason}", flush=True)
        except (ApiException, InvalidSpecError, ValueError, OSError) as exc:
            # the next interval tries again: a planner that exits takes the scaling with it
            print(f"{args.name}: no decision: {exc}", file=sys.stderr, flush=True)
        if args.once or loop.pause(stop):
            return 0
