"""tuner.incluster.load without a cluster: where an in-cluster tuning's load comes from
(spec.workload / workloadFrom), the LoadSpec its measurements share (loadWorkers), and the
capacity search with the autoscaler's target it implies."""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from loadtests.workloads.trace import TraceRequest, write_trace
from tuner.incluster import load as cluster_load
from paged_api.contract import parse_tuning
from tuner.sources.workload_source import WorkloadSource

BASE = {"targetRef": {"name": "svc"}, "searchSpace": {"maxNumSeqs": [4, 8]},
        "trialDuration": "10s"}
TRACE = [TraceRequest(0.5 * i, 40, 8, "sys" if i % 2 else None, 16 if i % 2 else 0)
         for i in range(9)]   # 9 requests over 4 s: 2 req/s


def spec_of(**fields):
    return parse_tuning({**BASE, **fields})


def from_config_map(tmp_path, monkeypatch, **fields):
    path = tmp_path / "mounted" / "trace.jsonl"
    path.parent.mkdir()
    write_trace(path, TRACE)
    monkeypatch.setenv(cluster_load.TRACE_FILE_ENV, str(path))
    spec = spec_of(workloadFrom={"trace": {"configMapRef": {"name": "traffic"}}}, **fields)
    return spec, cluster_load.workload_source(spec, namespace="team", out_dir=tmp_path / "out")


def test_a_trace_config_map_replays_open_loop_on_the_load_workers(tmp_path, monkeypatch):
    spec, source = from_config_map(tmp_path, monkeypatch, loadWorkers=2,
                                   slo={"ttftSeconds": 0.5})
    assert source.trace_rate == pytest.approx(2.0)
    assert "the ConfigMap 'traffic' (key 'trace.jsonl')" in source.document
    assert "prefix groups: 1 holding 4 of 9 requests" in source.document
    load, slos = cluster_load.load_spec(spec, source, model_name="m")
    assert (load.workload, load.arrival, load.workers, load.trace_speed) == \
        ("trace", "open", 2, 1.0)
    assert Path(load.trace) == source.trace and load.model_name == "m"
    assert slos == {"trace": {"ttft": 0.5, "tpot": 0.1}}
    status = cluster_load.describe(spec, source)
    assert status["source"] == "workloadFrom.trace" and status["loadWorkers"] == 2
    assert status["traceRate"] == 2.0 and status["document"] == source.document


def test_a_rate_rescales_the_trace(tmp_path, monkeypatch):
    spec, source = from_config_map(tmp_path, monkeypatch, rate=6.0)
    load, _ = cluster_load.load_spec(spec, source, model_name=None)
    assert load.trace_speed == pytest.approx(3.0)


def test_a_named_workload_is_closed_loop_with_its_users_and_workers():
    spec = spec_of(workload="rag", loadWorkers=3, users=6)
    source = cluster_load.workload_source(spec, namespace="team", out_dir=Path("unused"))
    assert source.trace is None and source.document is None
    load, slos = cluster_load.load_spec(spec, source, model_name=None)
    assert (load.workload, load.arrival, load.users, load.workers) == ("rag", "closed", 6, 3)
    assert set(slos) == set(source.spec.slos)
    assert cluster_load.describe(spec, source) == {"source": "workload", "name": "rag",
                                                   "loadWorkers": 3}


def test_a_missing_or_bad_trace_names_the_field_and_the_config_map(tmp_path, monkeypatch):
    spec = spec_of(workloadFrom={"trace": {"configMapRef": {"name": "traffic", "key": "k"}}})
    monkeypatch.setenv(cluster_load.TRACE_FILE_ENV, str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"configMapRef: the ConfigMap 'traffic' \(key 'k'\) "
                                         "is missing or empty"):
        cluster_load.workload_source(spec, namespace="team", out_dir=tmp_path)
    (tmp_path / "bad").write_text('{"timestamp": 0}\n')
    monkeypatch.setenv(cluster_load.TRACE_FILE_ENV, str(tmp_path / "bad"))
    with pytest.raises(ValueError, match=r"spec\.workloadFrom\.trace: the ConfigMap 'traffic'.*"
                                         "prompt_tokens"):
        cluster_load.workload_source(spec, namespace="team", out_dir=tmp_path)


def test_a_trace_url_is_fetched_once_and_bounded(tmp_path, monkeypatch):
    write_trace(tmp_path / "served.jsonl", TRACE)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *_):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        spec = spec_of(workloadFrom={"trace": {"url": f"{url}/served.jsonl"}})
        out = tmp_path / "out"
        out.mkdir()
        source = cluster_load.workload_source(spec, namespace="team", out_dir=out)
        assert source.trace == (out / "trace.jsonl").resolve()
        assert f"trace.url {url}/served.jsonl" in source.document
        missing = spec_of(workloadFrom={"trace": {"url": f"{url}/nothing.jsonl"}})
        with pytest.raises(ValueError, match=r"spec\.workloadFrom\.trace\.url: cannot fetch"):
            cluster_load.workload_source(missing, namespace="team", out_dir=out)
        monkeypatch.setattr(cluster_load, "MAX_TRACE_BYTES", 100)
        with pytest.raises(ValueError, match=r"trace\.url: cannot fetch .* \(larger than"):
            cluster_load.workload_source(spec, namespace="team", out_dir=out)
    finally:
        server.shutdown()


def test_prometheus_fits_over_the_targets_pods_unless_a_selector_is_given(tmp_path,
                                                                        monkeypatch):
    calls = []

    def fit(url, **kwargs):
        calls.append((url, kwargs))
        if kwargs["selector"] == "broken":
            raise ValueError("no histogram buckets")
        return WorkloadSource(name="trace", spec=None, document="# fitted\n")
    monkeypatch.setattr(cluster_load, "from_prometheus", fit)
    prom = {"prometheus": {"url": "http://prom:9090"}}
    spec = spec_of(**prom, workloadFrom={"prometheus": {"window": "6h"}}, seed=3)
    assert cluster_load.workload_source(spec, namespace="team", out_dir=tmp_path).document
    assert calls == [("http://prom:9090", {
        "window": "6h", "selector": 'namespace="team",pod=~"svc-[^-]+-[^-]+"',
        "duration": 10.0, "seed": 3, "out_dir": tmp_path})]
    broken = spec_of(**prom, workloadFrom={"prometheus": {"selector": "broken"}})
    with pytest.raises(ValueError, match=r"spec\.workloadFrom\.prometheus: no workload could "
                                         r"be fitted from http://prom:9090 \(no histogram"):
        cluster_load.workload_source(broken, namespace="team", out_dir=tmp_path)


@pytest.mark.parametrize("metric, figures, target", [
    (None, {"num_requests_waiting_mean": 2.345}, "2.35"),
    ("queueDepth", {"num_requests_waiting_mean": 0.0}, "0.1"),      # an HPA target is > 0
    ("kvCacheUsage", {"kv_cache_usage_perc_mean": 0.734}, "0.73"),
    ("kvCacheUsage", {"kv_cache_usage_perc_mean": 1.2}, "1"),
])
def test_the_autoscalers_target_is_its_metric_at_capacity(metric, figures, target):
    autoscaling = {"maxReplicas": 4, **({"metric": metric} if metric else {})}
    found = cluster_load.autoscaler_target(autoscaling, figures)
    assert found["target"] == target and found["metric"] == (metric or "queueDepth")


def test_no_gauge_leaves_the_autoscalers_target_alone():
    found = cluster_load.autoscaler_target({"metric": "kvCacheUsage"}, {})
    assert "target" not in found and "left as it is" in found["reason"]


@pytest.mark.parametrize("fields, autoscaled, wanted", [
    ({}, False, False), ({}, True, False), ({"apply": {"mode": "Auto"}}, False, False),
    ({"apply": {"mode": "Auto"}}, True, True), ({"capacity": {}}, False, True)])
def test_capacity_is_measured_when_asked_or_when_auto_sets_the_autoscaler(
        fields, autoscaled, wanted):
    target = {"spec": {"autoscaling": {"maxReplicas": 2}} if autoscaled else {}}
    assert cluster_load.wants_capacity(spec_of(**fields), target) is wanted


def test_capacity_probes_one_trial_service_and_reads_the_metric_at_the_passing_rate(
        tmp_path, monkeypatch):
    """A replica that meets its SLOs up to 8 req/s, whose queue is rate / 4 deep."""
    events = []
    cluster = SimpleNamespace(
        create_trial=lambda name, target, engine, owner: events.append(("create", name,
                                                                        engine)),
        wait_ready=lambda name, timeout: None,
        endpoint_url=lambda name: "http://trial:8000",
        delete_service=lambda name, wait: events.append(("delete", name)))

    seeds = []
    building = []   # when set, above 4 req/s each probe's queue builds (0.5 s of wait per s)

    def measure(url, load, slos, *, workdir, warmup_requests, prometheus):
        workdir.mkdir(parents=True, exist_ok=bool(building))   # a second search's probes
        seeds.append(load.seed)
        ok = load.rate <= 8
        slope = 0.5 if building and load.rate > 4 else 0.0
        lines = [{"event": "start", "t": 0.0}, *({"kind": "chat", "start": i / 10, "ok": ok,
                                                  "ttft": 0.1 + slope * i / 10, "e2e": 0.2}
                                                 for i in range(10)),
                 {"event": "stop", "t": 10.0}]
        (workdir / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return {"num_requests_waiting_mean": load.rate / 4}
    monkeypatch.setattr(cluster_load, "measure", measure)
    spec = spec_of(capacity={"maxProbes": 4}, users=2)
    run = SimpleNamespace(
        spec=spec, name="tune", cluster=cluster, owner={}, out_dir=tmp_path,
        target={"spec": {"autoscaling": {"maxReplicas": 3, "metric": "queueDepth"}}},
        target_engine={"blockSize": 16, "maxNumSeqs": 16},
        source=SimpleNamespace(trace_rate=None), slos={"chat": {"ttft": 1.0}},
        load=cluster_load.load_spec(spec, cluster_load.workload_source(
            spec, namespace="t", out_dir=tmp_path), model_name=None)[0],
        prometheus=None)
    found = cluster_load.measure_capacity(run, {"maxNumSeqs": 4}, start=2.0)
    assert [p["rate"] for p in found["probes"]] == [2.0, 4.0, 8.0, 16.0]
    # each probe its own requests: the last probe's would be in the service's prefix cache
    assert seeds == [run.load.seed + 1000 * k for k in range(4)]
    assert found["ratePerReplica"] == 8.0 and found["upper"] == 16.0
    assert found["engine"] == {"blockSize": 16, "maxNumSeqs": 4}
    assert found["autoscaling"] == {"metric": "queueDepth", "target": "2", "measured": 2.0}
    assert events == [("create", "tune-cap", {"blockSize": 16, "maxNumSeqs": 4}),
                      ("delete", "tune-cap")]
    # a queue that builds inside the window fails a probe for the minute it would not
    # hold (the default), and passes with spec.capacity.sustainSeconds 0 (within the SLO now)
    building.append(True)
    assert cluster_load.measure_capacity(run, {"maxNumSeqs": 4}, start=2.0)[
        "ratePerReplica"] == 4.0
    run.spec = spec_of(capacity={"maxProbes": 4, "sustainSeconds": 0}, users=2)
    assert cluster_load.measure_capacity(run, {"maxNumSeqs": 4}, start=2.0)[
        "ratePerReplica"] == 8.0
