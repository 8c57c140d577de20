"""The chart's Grafana dashboard against the local cluster's real Prometheus: the engine of
examples/service-cpu.yaml serves a short load through its Service (the real `openai`
client, some prompts sharing a prefix) while a tuning run (`python -m tuner sweep`, one
trial on the stand-in engine) registers its trial engine as a Prometheus target; then every
panel's PromQL, template variables substituted, must return data as Grafana would ask for
it (range queries, 1 s steps)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from cluster_harness import ROOT, LocalCluster

pytestmark = pytest.mark.xdist_group("local_cluster_dashboard")

_spec = importlib.util.spec_from_file_location("render_dashboard",
                                               ROOT / "scripts" / "render_dashboard.py")
dash = sys.modules.setdefault("render_dashboard", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(dash)

FAKE_ENGINE = f"{sys.executable} {ROOT / 'tests' / 'tuner' / 'fake_engine.py'}"
# Grafana's $__rate_interval is at least 4x the scrape interval (scrapes are 1 s here, with
# a 1-s timeout that a loaded machine's scrapes can miss): 30-s windows, which the same
# PromQL answers alike
RATE_INTERVAL = "30s"
SHARED_PREFIX = ("You are a careful assistant for a paged-attention inference engine. Answer "
                 "briefly, cite the block table, and never invent numbers you did not measure. ")


@dataclass
class Loaded:
    cluster: LocalCluster
    prometheus: str
    pod: str
    start: float
    end: float

    def series(self, expr: str, **variables: str):
        values = {"namespace": "default", "pod": self.pod, **variables}
        return dash.query_range(self.prometheus, dash.expand(expr, values, RATE_INTERVAL),
                                self.start, self.end, 1)


def _tuning_run(prometheus: str, targets: Path, out: Path, log) -> subprocess.Popen:
    """One search trial on the stand-in engine, its engine written as a file_sd target of the
    cluster's Prometheus (job="paged-tuner", trial="trial-0000") while it lives."""
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "sweep", "--workload", "chat", "--trials", "1",
         "--duration", "3", "--engine-cmd", FAKE_ENGINE, "--storage", f"sqlite:///{out}/s.db",
         "--out-dir", str(out), "--users", "2", "--length-scale", "0.1", "--no-progress",
         "--startup-timeout", "60", "--remeasure", "0", "--param", "block_size=16",
         "--param", "max_num_seqs=4", "--param", "gpu_memory_utilization=none",
         "--param", "max_num_batched_tokens=none",
         "--param", "num_speculative_tokens=none",
         "--param", "kv_offloading_size=none", "--prometheus", prometheus,
         "--prometheus-targets-dir", str(targets)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _planner(targets: Path):
    """The SLO planner's exporter (tuner/planner/metrics.py, as `python -m tuner plan
    --metrics-port` serves it) after two decisions for the service `tiny`, written as a
    file_sd target of the cluster's Prometheus in its namespace (the PodMonitor's labels)."""
    from prometheus_client import start_http_server

    from tuner.measure.promql import write_target
    from tuner.planner.core import Decision
    from tuner.planner.metrics import PlannerMetrics

    metrics = PlannerMetrics("default", "tiny")
    for previous, replicas in ((1, 2), (2, 2)):
        metrics.record(Decision(at=time.time(), replicas=replicas, wanted=replicas,
                                reason="3.1 req/s forecast", rate=3.0, forecast=3.1,
                                capacity=2.0, correction=1.1, corrected_capacity=1.8),
                       previous)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    write_target(targets, "planner-tiny", f"http://127.0.0.1:{server.server_port}",
                 {"job": "paged-planner", "namespace": "default"})
    return server


def _load(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    prompts = [SHARED_PREFIX + q for q in ("What is a block?", "Why page the KV cache?",
                                           "What is a slot mapping?", "Define preemption.")]
    prompts += [f"Tell me about number {i} and its friends." for i in range(4)]

    def ask(prompt: str) -> int:
        done = client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                         temperature=0)
        return done.usage.completion_tokens

    assert ask(prompts[0]) == 8    # first, alone: the shared prefix is cached for the rest
    with ThreadPoolExecutor(4) as pool:
        assert all(n > 0 for n in pool.map(ask, prompts[1:]))


def _name(pod: dict) -> str:
    return pod["metadata"]["name"]


def _instant(prometheus: str, query: str) -> list:
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


@pytest.fixture(scope="module")
def loaded(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    start = time.time()
    prometheus = local_cluster.info["prometheus"]
    out = tmp_path_factory.mktemp("tuner")
    local_cluster.kubectl("apply", "-f", str(ROOT / "examples/service-cpu.yaml"))
    log = (out / "tuner.log").open("w")
    _planner(local_cluster.dir / "prometheus" / "targets")   # serves until the module ends
    tuner = _tuning_run(prometheus, local_cluster.dir / "prometheus" / "targets", out, log)
    try:
        local_cluster.kubectl("wait", "pis/tiny", "--for=condition=Ready", "--timeout=180s",
                              timeout=200)
        (pod,) = local_cluster.pods("app.kubernetes.io/instance=tiny")
        # Prometheus takes up new file_sd targets in batches (every 5 s or more): load once
        # it scrapes the pod, as a dashboard would only show a scraped pod anyway
        # ... and holds a sample of its counters from before the load (a rate needs one):
        # `up` alone can come from a scrape of the engine's early /metrics, before its
        # serving metrics exist, and on a loaded machine the next scrape may come after
        # the short load (CI 2026-12-07: every latency panel empty)
        local_cluster.wait_for(lambda: _instant(
            prometheus, f'vllm:time_to_first_token_seconds_count{{pod="{_name(pod)}"}} == 0'),
            60, "Prometheus to scrape the engine's counters before the load")
        _load(local_cluster.service_url("tiny"))
        assert tuner.wait(timeout=120) == 0, (out / "tuner.log").read_text()[-3000:]
        local_cluster.wait_for(lambda: _instant(prometheus, 'up{job="paged-planner"} == 1'),
                               60, "Prometheus to scrape the planner's exporter")
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
        log.close()
    # until Prometheus holds a scrape taken after the load (on a loaded machine scrapes
    # time out: a range ending before the first one after the load shows no rate)
    for series in ("vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds_count",
                   "vllm:prefix_cache_hits_total"):
        local_cluster.wait_for(
            lambda series=series: _instant(prometheus, f'{series}{{pod="{_name(pod)}"}} > 0'),
            60, f"Prometheus to scrape {series} after the load")
    time.sleep(3)   # a few 1 s scrapes after the load
    return Loaded(local_cluster, prometheus, _name(pod), start, time.time())


def test_every_panel_query_returns_data(loaded: Loaded) -> None:
    queries = dash.panel_queries(dash.load_dashboard())
    assert len({q.title for q in queries}) == 16
    empty = [f"{q.title} [{q.ref_id}]: {q.expr}" for q in queries
             if dash.finite_points(loaded.series(q.expr)) == 0]
    assert not empty, "panels without data:\n" + "\n".join(empty)


def _peak(loaded: Loaded, title: str, ref_id: str = "A", **variables: str) -> float:
    (query,) = [q for q in dash.panel_queries(dash.load_dashboard())
                if q.title == title and q.ref_id == ref_id]
    values = [v for _, points in loaded.series(query.expr, **variables) for _, v in points
              if v == v]
    return max(values, default=float("nan"))


def test_the_panels_show_the_load_and_the_trial(loaded: Loaded) -> None:
    assert _peak(loaded, "Generation tokens/s") > 0
    assert _peak(loaded, "Prompt tokens/s") > 0
    assert 0 < _peak(loaded, "Prefix-cache hit rate") <= 1     # the shared prefix hit
    assert 0 < _peak(loaded, "Time to first token", "C") < 60  # p99, in seconds
    assert _peak(loaded, "Finished requests/s by reason") > 0
    assert _peak(loaded, "Trial finished requests/s") > 0
    (query,) = [q for q in dash.panel_queries(dash.load_dashboard())
                if q.title == "Trial engines scraped"]
    assert [labels["trial"] for labels, _ in loaded.series(query.expr)] == ["trial-0000"]
    assert _peak(loaded, "Planner replicas") == 2
    assert _peak(loaded, "Planner traffic and capacity", "C") == pytest.approx(3.6)
    assert _peak(loaded, "Planner correction and decisions") == pytest.approx(1.1)


def test_the_template_variables_select(loaded: Loaded) -> None:
    # $namespace and $pod filter: another namespace or pod shows nothing
    queries = {q.title: q.expr for q in dash.panel_queries(dash.load_dashboard())}
    assert loaded.series(queries["KV cache usage"])
    assert not loaded.series(queries["KV cache usage"], namespace="elsewhere")
    assert not loaded.series(queries["KV cache usage"], pod="tiny-nope")
    # the variables' own queries, label_values(metric{...}, label), list this cluster's
    variables = {v["name"]: v for v in dash.load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for name, expected in (("namespace", "default"), ("pod", loaded.pod)):
        metric, label = dash.expand(variables[name]["query"]["query"], {"namespace": "default"},
                                    RATE_INTERVAL).removeprefix("label_values(")[:-1] \
            .rsplit(", ", 1)
        params = urllib.parse.urlencode({"match[]": metric, "start": loaded.start})
        with urllib.request.urlopen(f"{loaded.prometheus}/api/v1/label/{label}/values?"
                                    f"{params}", timeout=10) as response:
            assert expected in json.load(response)["data"]


def test_render_dashboard_draws_every_panel(loaded: Loaded, tmp_path: Path) -> None:
    out = tmp_path / "dashboard.png"
    points = dash.render(loaded.prometheus, out, start=loaded.start, end=loaded.end,
                         variables={"namespace": "default", "pod": ".*"},
                         rate_interval=RATE_INTERVAL)
    assert len(points) == 16 and all(points.values()), points
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 50_000


def test_an_unknown_variable_is_named() -> None:
    with pytest.raises(ValueError, match=r"\$cluster"):
        dash.expand('up{cluster="$cluster"}', {"namespace": "default"}, "5s")
