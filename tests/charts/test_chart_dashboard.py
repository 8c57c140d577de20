"""The Grafana dashboard ConfigMap, rendered with the real helm: off by default, carried
byte-for-byte from dashboards/paged-inference.json with the sidecar's label when enabled,
and the JSON is a dashboard Grafana can load (unique ids, variables, every panel's queries
against the datasource variable, every engine query filtered by $namespace and $pod)."""
from __future__ import annotations

import json
import re

import pytest
from chart_tools import CHART, helm, render, validate_k8s

from engine.entrypoints.metrics import ServerMetrics
from tuner.planner.metrics import PlannerMetrics

DASHBOARD = CHART / "dashboards" / "paged-inference.json"
PANEL_METRICS = {   # what the panels plot; each must be a series the engine exports
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:request_success_total",
    "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    "vllm:num_preemptions_total"}
PLANNER_METRICS = {   # the planner row's; each a series the planner exports
    "paged_planner_replicas", "paged_planner_wanted_replicas", "paged_planner_arrival_rate",
    "paged_planner_forecast_rate", "paged_planner_replica_capacity",
    "paged_planner_correction", "paged_planner_decisions_total"}


def exported_series() -> set[str]:
    """Sample names of the engine's own registry (engine/entrypoints/metrics.py) and of
    the SLO planner's (tuner/planner/metrics.py, after one decision: its gauges)."""
    from tuner.planner.core import Decision

    metrics = ServerMetrics(model_name="tiny", max_model_len=512)
    planner = PlannerMetrics("ns", "svc")
    planner.record(Decision(at=0, replicas=2, reason="r", rate=1, forecast=1, capacity=1,
                            correction=1, corrected_capacity=1, wanted=2), previous=1)
    return {s.name for registry in (metrics.registry, planner.registry)
            for family in registry.collect() for s in family.samples}


def dashboard_configmaps(*set_args: str) -> list[dict]:
    return [d for d in render(*set_args) if d["kind"] == "ConfigMap"
            and "paged-inference.json" in d.get("data", {})]


def test_off_by_default():
    assert dashboard_configmaps() == []


def test_enabled_renders_the_file_with_the_sidecar_label():
    (cm,) = dashboard_configmaps("grafanaDashboard.enabled=true")
    validate_k8s(cm)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "pio"
    assert cm["metadata"]["namespace"] == "inference"
    assert cm["data"]["paged-inference.json"] == DASHBOARD.read_text().strip()


def test_namespace_labels_and_annotations_are_settable():
    (cm,) = dashboard_configmaps("grafanaDashboard.enabled=true",
                                 "grafanaDashboard.namespace=monitoring",
                                 "grafanaDashboard.labels.grafana_dashboard=null",
                                 "grafanaDashboard.labels.team-dashboards=yes",
                                 "grafanaDashboard.annotations.grafana_folder=LLM")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["labels"]["team-dashboards"] == "yes"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}


def test_a_misspelt_dashboard_value_is_refused():
    proc = helm("template", "pio", str(CHART), "--set", "grafanaDashboard.enable=true",
                check=False)
    assert proc.returncode != 0 and "enable" in proc.stderr


def test_lint_with_the_dashboard_is_clean():
    proc = helm("lint", "--strict", str(CHART), "--set", "grafanaDashboard.enabled=true")
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_json_is_a_loadable_dashboard(dashboard):
    assert dashboard["uid"] == "paged-inference" and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["pod"]["includeAll"] and variables["pod"]["allValue"] == ".*"
    assert "$namespace" in variables["pod"]["query"]["query"]
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


def test_queries_use_the_engines_metric_names_and_the_variables(dashboard):
    titles, used = [], set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            used |= set(re.findall(r"(vllm:\w+|paged_planner_\w+|\bup)\{", expr))
            if "paged-tuner" in expr:   # the tuner's trial engines live outside namespaces
                continue
            for selector in re.findall(r"\{([^}]*)\}", expr):
                if "paged_planner_" in expr:   # the planner's pod is no engine pod: no $pod
                    assert selector == 'namespace="$namespace"', (panel["title"], expr)
                    continue
                assert 'namespace="$namespace"' in selector and 'pod=~"$pod"' in selector, \
                    (panel["title"], expr)
            if "rate(" in expr or "increase(" in expr:
                assert "[$__rate_interval]" in expr, (panel["title"], expr)
        titles.append(panel["title"])
    assert used - {"up"} <= exported_series(), used - exported_series()
    assert used - {"up"} == PANEL_METRICS | PLANNER_METRICS, \
        used ^ (PANEL_METRICS | PLANNER_METRICS)
    for wanted in ("Time to first token", "Inter-token latency", "End-to-end request latency",
                   "Running and waiting requests", "KV cache usage", "Prefix-cache hit rate",
                   "Preemptions", "Generation tokens/s", "Prompt tokens/s",
                   "Trial engines scraped", "Planner replicas",
                   "Planner traffic and capacity", "Planner correction and decisions"):
        assert wanted in titles
