"""`python -m tuner plan` (tuner/planner/run.py): one interval of a service's SLO planner
against the local API server (real kubernetes client, the chart's CRDs) and a real
Prometheus scraping a served load. The predictor stands in for the simulator (whose
capacity per mix tests/tuner/test_sim_cli.py pins): the loop is what is tested here,
from the PagedInferenceService's spec to the Deployment's scale subresource, status.planner
and the Event."""
from __future__ import annotations

import time

import httpx
import pytest

from fake_openai_server import FakeOpenAIServer
from local_api import api_url, kube_client
from localcluster.prometheus import start_prometheus
from paged_api.service import InvalidSpecError, parse_spec
from tuner.measure.loadgen import LoadSpec, run_load
from tuner.measure.promql import PrometheusReader, write_target
from tuner.planner.metrics import PlannerMetrics
from tuner.planner.core import UTILISATION, Prediction
from tuner.planner.run import Loop, ServiceScale, held_at, selector

__all__ = ["api_url"]   # the module's API server (a fixture)
GROUP, VERSION = "serving.pagedinference.dev", "v1alpha1"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    proc = start_prometheus(workdir, scrape_interval="1s")
    yield proc, workdir / "targets"
    proc.stop()


def make_service(api, name: str, autoscaling: dict, replicas: int, router: bool = False) -> None:
    from kubernetes import client
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, "default", "pagedinferenceservices",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PagedInferenceService",
         "metadata": {"name": name},
         "spec": {"model": {"uri": "builtin://default"}, "autoscaling": autoscaling,
                  "router": {"enabled": router}}})
    labels = {"app": name}
    client.AppsV1Api(api).create_namespaced_deployment("default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "e", "image": "engine"}]}}}})


def make_slice(api, service: str, suffix: str, *urls: str, serving: bool = True) -> None:
    """An EndpointSlice of `service` listing the router pods at `urls` (one port)."""
    from kubernetes import client
    hosts = [u.removeprefix("http://").rsplit(":", 1) for u in urls]
    client.DiscoveryV1Api(api).create_namespaced_endpoint_slice("default", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{service}-{suffix}",
                     "labels": {"kubernetes.io/service-name": service}},
        "ports": [{"name": "http", "port": int(hosts[0][1]), "protocol": "TCP"}],
        "endpoints": [{"addresses": [host], "conditions": {"ready": serving,
                                                           "serving": serving}}
                      for host, _ in hosts]})


def events_of(api, name: str) -> list:
    from kubernetes import client
    found = client.CoreV1Api(api).list_namespaced_event("default").items
    return [e for e in found if e.involved_object.name == name]


def test_a_served_load_scales_the_deployment_and_the_decision_is_recorded(
        api_url, prometheus, tmp_path):
    api, (prom, targets) = kube_client(api_url), prometheus
    make_service(api, "chat", {"mode": "slo", "maxReplicas": 8, "minReplicas": 1,
                               "slo": {"ttftSeconds": 1.0}, "intervalSeconds": 5,
                               "prometheusServerAddress": prom.url,
                               "selector": 'job="planner-run"'}, replicas=1)
    reader = PrometheusReader(prom.url, timeout=30)
    with FakeOpenAIServer(ttft=0.02, itl=0.01) as server:
        write_target(targets, "planner-run", server.url, {"job": "planner-run"})
        reader.wait_for_scrape('{job="planner-run"}', after=time.time())
        run_load(LoadSpec(workload="chat", duration=4, users=3, length_scale=0.1),
                 url=server.url, workdir=tmp_path)
        end = reader.wait_for_scrape('{job="planner-run"}', after=time.time())
        served = len(server.requests)
    seen = []

    def predictor_for(spec):
        assert selector(spec) == 'job="planner-run"'

        def predict(fitted, per_replica_rate):   # one replica serves a quarter of the load
            seen.append(per_replica_rate)
            return Prediction(capacity=seen[0] / 4 / UTILISATION)
        return predict

    scale = ServiceScale(api, "default", "chat")
    metrics = PlannerMetrics("default", "chat")
    loop = Loop(scale, predictor_for=predictor_for, clock=lambda: end, metrics=metrics)
    decision = loop.tick()
    assert served > 0 and seen and decision.replicas == 4, decision
    # the decision's series on the planner's /metrics (the dashboard's planner row)
    value = lambda name, **extra: metrics.registry.get_sample_value(   # noqa: E731
        name, {"namespace": "default", "service": "chat", **extra})
    assert value("paged_planner_replicas") == 4 == value("paged_planner_wanted_replicas")
    assert value("paged_planner_arrival_rate") == pytest.approx(decision.rate)
    assert value("paged_planner_replica_capacity") == pytest.approx(seen[0] / 4)
    assert value("paged_planner_correction") == pytest.approx(decision.correction)
    assert [value("paged_planner_decisions_total", outcome=o)
            for o in ("scaled", "kept", "held")] == [1, 0, 0]
    assert loop.interval == 5 and loop.step is not None and loop.step.window == 10
    assert scale.replicas() == 4   # through the scale subresource
    status = scale.service()["status"]["planner"]
    assert status["replicas"] == 4 and status["previousReplicas"] == 1 and not status["held"]
    assert status["observed"]["rate"] == pytest.approx(decision.rate)
    assert "req/s per replica" in status["reason"]
    [event] = events_of(api, "chat")
    assert (event.reason, event.type) == ("PlannerScaled", "Normal")
    [cond] = scale.service()["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Planning", "True", "PlannerScaled")
    assert event.message.startswith("replicas 1 -> 4: ")
    # the same spec keeps the planner (its smoothing and stabilisation); a new one restarts it
    step = loop.step
    assert loop.tick().replicas == 4 and loop.step is step and seen[1] == pytest.approx(seen[0] / 4)
    from kubernetes import client
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, "default", "pagedinferenceservices", "chat",
        {"spec": {"autoscaling": {"maxReplicas": 3}}})
    decision = loop.tick()
    assert loop.step is not step and decision.replicas == 3 == scale.replicas()
    assert "bounded to [1, 3]" in decision.reason


def test_without_prometheus_the_replicas_stay_and_the_status_says_why(api_url):
    api = kube_client(api_url)
    make_service(api, "dark", {"mode": "slo", "maxReplicas": 4, "minReplicas": 1,
                               "slo": {"itlSeconds": 0.1},
                               "prometheusServerAddress": "http://127.0.0.1:9"}, replicas=2)
    scale = ServiceScale(api, "default", "dark")
    metrics = PlannerMetrics("default", "dark")
    decision = Loop(scale, predictor_for=lambda spec: None, clock=time.time,
                    metrics=metrics).tick()
    assert decision.replicas == 2 and scale.replicas() == 2
    labels = {"namespace": "default", "service": "dark"}
    assert metrics.registry.get_sample_value("paged_planner_decisions_total",
                                             {**labels, "outcome": "held"}) == 1
    assert metrics.registry.get_sample_value("paged_planner_replicas", labels) == 2
    # nothing observed: no traffic figure is made up
    assert metrics.registry.get_sample_value("paged_planner_arrival_rate", labels) is None
    service = scale.service()
    planner = service["status"]["planner"]
    assert planner["held"] and planner["reason"].startswith("unchanged: Prometheus at")
    [cond] = service["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Planning", "False", "PlannerHeld")
    assert cond["message"] == planner["reason"] and cond["observedGeneration"] == 1
    [event] = events_of(api, "dark")
    assert (event.reason, event.type, event.count) == ("PlannerHeld", "Warning", 1)
    # held again for the same reason: the Event counts up, the condition keeps its time
    loop = Loop(scale, predictor_for=lambda spec: None, clock=time.time)
    loop.tick()
    loop.tick()
    [event] = events_of(api, "dark")
    assert event.count == 3 and event.last_timestamp >= event.first_timestamp
    assert scale.service()["status"]["conditions"] == [cond]


def test_the_planners_condition_keeps_the_operators_across_a_concurrent_write(api_url):
    """The planner writes the conditions list whole, conditionally on what it read: the
    operator's Ready written after that read is kept (a conflict, a fresh read, a retry)."""
    from kubernetes import client

    from tuner.planner.core import Decision

    api = kube_client(api_url)
    make_service(api, "both", {"mode": "slo", "maxReplicas": 4, "minReplicas": 1,
                               "slo": {"ttftSeconds": 1.0}}, replicas=2)
    scale = ServiceScale(api, "default", "both")
    read = scale.service()
    ready = {"type": "Ready", "status": "True", "reason": "AllReplicasReady",
             "message": "2/2 replicas ready", "lastTransitionTime": "2026-12-04T07:00:00Z"}
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", "pagedinferenceservices", "both",
        {"status": {"conditions": [ready]}}, _content_type="application/merge-patch+json")
    scale.record(read, Decision(at=time.time(), replicas=3, wanted=3, reason="3.0 req/s"),
                 None, previous=2)
    conditions = scale.service()["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Ready", "Planning"]
    assert conditions[0] == ready
    assert (conditions[1]["status"], conditions[1]["reason"]) == ("True", "PlannerScaled")


def test_at_zero_replicas_requests_held_by_the_router_bring_the_first_replica(api_url):
    """Scaled to zero, the service has no series in Prometheus: the router's held requests
    (a real router holding one) wake the planner, which scales to one replica at once."""
    import threading

    from router_fakes import FakeBackend
    from router_harness import RouterThread

    api = kube_client(api_url)
    make_service(api, "cold", {"mode": "slo", "maxReplicas": 4, "minReplicas": 0,
                               "slo": {"ttftSeconds": 1.0}, "idleWindowSeconds": 60,
                               "prometheusServerAddress": "http://127.0.0.1:9"}, replicas=0,
                 router=True)
    scale = ServiceScale(api, "default", "cold")
    with FakeBackend("127.0.0.5") as engine, \
            RouterThread(backends=[engine.url], hold_seconds=30.0) as router:
        engine.health_status = 503   # no replica serves
        deadline = time.monotonic() + 15
        while httpx.get(router.url + "/health").json()["healthy_backends"] != 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        make_slice(api, "cold", "a", router.url)   # the Service's one router pod
        loop = Loop(scale, predictor_for=lambda spec: None, clock=time.time)
        kept = loop.tick()    # nothing held: zero stays (Prometheus is not asked)
        assert kept.replicas == 0 and scale.replicas() == 0 and "zero stays" in kept.reason
        # between ticks (30 s apart) the routers are polled: a held request ends the wait
        paused: list[bool] = []
        stop = threading.Event()
        waiter = threading.Thread(target=lambda: paused.append(loop.pause(stop)), daemon=True)
        waiter.start()
        got = []
        thread = threading.Thread(target=lambda: got.append(httpx.post(
            router.url + "/v1/completions", json={"prompt": "p"}, timeout=30)), daemon=True)
        thread.start()
        while held_at(router.url) < 1:
            assert time.monotonic() < deadline + 15
            time.sleep(0.02)
        waiter.join(10)
        assert paused == [False]   # woken by the held request, well before the interval
        assert loop.interval == 30
        woke = loop.tick()
        assert woke.replicas == 1 == scale.replicas()
        assert woke.reason == "1 request(s) held by the router with no replica serving"
        assert sorted(e.reason for e in events_of(api, "cold")) == ["PlannerKept", "PlannerScaled"]
        engine.health_status = 200   # the replica is ready: the held request is served
        thread.join(30)
        assert [r.status_code for r in got] == [200]
        stop.set()
        assert loop.pause(stop) is True   # one replica now: the interval's wait, stopped
    assert held_at("http://127.0.0.1:9") == 0   # no router answering: nothing held


def test_a_service_not_in_mode_slo_is_not_planned(api_url):
    api = kube_client(api_url)
    make_service(api, "hpa", {"maxReplicas": 4}, replicas=3)
    scale = ServiceScale(api, "default", "hpa")
    with pytest.raises(InvalidSpecError, match="spec.autoscaling.mode is not slo"):
        Loop(scale, predictor_for=lambda spec: None, clock=time.time).tick()
    assert scale.replicas() == 3 and events_of(api, "hpa") == []


def test_the_requests_held_by_every_router_replica_are_summed(api_url):
    """Each router pod holds its own requests: the planner asks every pod its Service's
    EndpointSlices list as serving (not one, through the Service), and none other."""
    from router_fakes import FakeBackend
    from router_harness import RouterThread

    api = kube_client(api_url)
    make_service(api, "pair", {"mode": "slo", "maxReplicas": 4, "minReplicas": 0,
                               "slo": {"ttftSeconds": 1.0}}, replicas=0, router=True)
    scale = ServiceScale(api, "default", "pair")
    spec = parse_spec(scale.service()["spec"], name="pair", namespace="default")
    with FakeBackend("127.0.0.6") as engine, \
            RouterThread(backends=[engine.url], hold_seconds=30.0) as a, \
            RouterThread(backends=[engine.url], hold_seconds=30.0) as b, \
            RouterThread(backends=[engine.url], hold_seconds=30.0) as leaving:
        engine.health_status = 503
        for router in (a, b, leaving):
            wait_until(lambda: httpx.get(router.url + "/health").json()["healthy_backends"] == 0)
        make_slice(api, "pair", "a", a.url)
        make_slice(api, "pair", "b", b.url)
        make_slice(api, "pair", "c", leaving.url, serving=False)
        make_slice(api, "other", "a", leaving.url)        # another Service's
        assert scale.router_urls() == sorted([a.url, b.url])
        threads = [post_in_thread(url) for url in (a.url, b.url, b.url, leaving.url)]
        for router, n in ((a, 1), (b, 2), (leaving, 1)):
            wait_until(lambda: held_at(router.url) == n)
        assert scale.router_held(spec) == 3
        spec_off = {**scale.service()["spec"], "router": {"enabled": False}, "autoscaling": {
            "mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 1.0}}}
        # without a router nothing is asked (the slices would be the engines')
        assert scale.router_held(parse_spec(spec_off, name="pair", namespace="default")) == 0
        engine.health_status = 200
        for thread in threads:
            thread.join(30)


def wait_until(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def post_in_thread(url: str):
    import threading
    thread = threading.Thread(target=lambda: httpx.post(url + "/v1/completions",
                                                        json={"prompt": "p"}, timeout=30),
                              daemon=True)
    thread.start()
    return thread
