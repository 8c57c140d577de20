"""What a PagedInferenceTuning becomes, pinned without a cluster: the Job's trace mount
(spec.workloadFrom.trace.configMapRef), its CPU for spec.loadWorkers, the Role (still only
the loop's calls), and the specs the operator refuses before making any Job."""
from __future__ import annotations

import pytest

from paged_operator import tuning_manifests as tm

BASE = {"targetRef": {"name": "svc"}, "searchSpace": {"maxNumSeqs": [4, 8]}}


def job_of(**spec):
    return tm.job("tune", "team", {**BASE, **spec}, image="engine:1")["spec"]["template"]["spec"]


def test_a_trace_config_map_is_mounted_read_only_and_named_to_the_tuner():
    pod = job_of(workloadFrom={"trace": {"configMapRef": {"name": "traffic",
                                                          "key": "monday.jsonl"}}})
    (volume,) = [v for v in pod["volumes"] if v["name"] == "trace"]
    assert volume["configMap"] == {"name": "traffic", "optional": True,
                                   "items": [{"key": "monday.jsonl", "path": "trace.jsonl"}]}
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "trace"]
    assert mount == {"name": "trace", "mountPath": tm.TRACE_DIR, "readOnly": True}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TUNER_TRACE_FILE"] == f"{tm.TRACE_DIR}/trace.jsonl" == tm.TRACE_FILE


@pytest.mark.parametrize("spec", [
    {}, {"workload": "chat"}, {"workloadFrom": {"trace": {"url": "https://x/t.jsonl"}}},
    {"workloadFrom": {"prometheus": {"window": "24h"}}, "prometheus": {"url": "http://p"}}])
def test_no_trace_volume_without_a_trace_config_map(spec):
    pod = job_of(**spec)
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert "TUNER_TRACE_FILE" not in {e["name"] for e in pod["containers"][0]["env"]}


def test_the_key_defaults_to_trace_jsonl():
    pod = job_of(workloadFrom={"trace": {"configMapRef": {"name": "traffic"}}})
    (volume,) = [v for v in pod["volumes"] if v["name"] == "trace"]
    assert volume["configMap"]["items"] == [{"key": "trace.jsonl", "path": "trace.jsonl"}]


@pytest.mark.parametrize("workers, cpu, memory", [(None, "1", "512Mi"), (1, "1", "512Mi"),
                                                  (2, "3", "768Mi"), (4, "5", "1280Mi")])
def test_load_workers_get_a_cpu_each_beside_the_tuner(workers, cpu, memory):
    spec = {} if workers is None else {"loadWorkers": workers}
    requests = job_of(**spec)["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": cpu, "memory": memory}


def test_the_role_still_allows_only_the_loops_calls():
    """The trace comes as a mount and the load workers are processes of the Job's pod: no
    rule on pods, on reading ConfigMaps, or on Secrets."""
    rules = tm.role("tune", "team")["rules"]
    granted = {(group, resource, verb) for r in rules for group in r["apiGroups"]
               for resource in r["resources"] for verb in r["verbs"]}
    assert ("", "configmaps", "get") not in granted
    assert not {g for g in granted if g[1] in ("pods", "secrets", "services", "deployments")}
    assert {(g, res) for g, res, _ in granted} == {
        ("serving.pagedinference.dev", "pagedinferencetunings"),
        ("serving.pagedinference.dev", "pagedinferencetunings/status"),
        ("serving.pagedinference.dev", "pagedinferenceservices"),
        ("discovery.k8s.io", "endpointslices"), ("", "configmaps")}


@pytest.mark.parametrize("spec", [
    {}, {"workload": "rag"},
    {"workloadFrom": {"trace": {"configMapRef": {"name": "t"}}}},
    {"workloadFrom": {"trace": {"url": "https://x/t.jsonl"}}},
    {"workloadFrom": {"prometheus": {}}, "prometheus": {"url": "http://prom:9090"}}])
def test_runnable_specs_are_not_refused(spec):
    assert tm.spec_error({**BASE, **spec}) is None


@pytest.mark.parametrize("spec, field", [
    ({"workload": "chat", "workloadFrom": {"trace": {"url": "https://x"}}},
     "spec.workload and spec.workloadFrom"),
    ({"workloadFrom": {"prometheus": {"window": "1h"}}},
     "spec.workloadFrom.prometheus needs spec.prometheus.url"),
    ({"workloadFrom": {"prometheus": {}}, "prometheus": {}},
     "spec.workloadFrom.prometheus needs spec.prometheus.url"),
    ({"workloadFrom": {}}, "spec.workloadFrom: give exactly one"),
    ({"workloadFrom": {"trace": {"url": "https://x"}, "prometheus": {}},
      "prometheus": {"url": "http://p"}}, "spec.workloadFrom: give exactly one"),
    ({"workloadFrom": {"trace": {}}}, "spec.workloadFrom.trace: give configMapRef"),
    ({"workloadFrom": {"trace": {"url": "https://x", "configMapRef": {"name": "t"}}}},
     "spec.workloadFrom.trace: give configMapRef"),
    ({"workloadFrom": {"trace": {"configMapRef": {}}}},
     "spec.workloadFrom.trace.configMapRef.name"),
])
def test_unrunnable_specs_are_refused_naming_the_field(spec, field):
    assert field in (tm.spec_error({**BASE, **spec}) or "")


def test_several_tuner_pods_make_an_indexed_job_and_one_pod_a_plain_one():
    store = {"storage": {"secretRef": {"name": "optuna-db"}}}
    job = tm.job("tune", "team", {**BASE, **store, "tunerPods": 3}, image="engine:1")["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 3, 3)
    (env,) = [e for e in job["template"]["spec"]["containers"][0]["env"]
              if e["name"] == "TUNER_STORAGE_URL"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "optuna-db", "key": "url"}
    single = tm.job("tune", "team", {**BASE, **store, "tunerPods": 1}, image="engine:1")["spec"]
    assert "completionMode" not in single and "parallelism" not in single
    assert tm.spec_error({**BASE, **store, "tunerPods": 3}) is None
    assert "spec.tunerPods 3 needs spec.storage.secretRef" in \
        tm.spec_error({**BASE, "tunerPods": 3})


def test_a_verify_window_needs_a_prometheus():
    assert "spec.apply.verifyWindow needs spec.prometheus.url" in \
        tm.spec_error({**BASE, "apply": {"verifyWindow": "5m"}})
    assert tm.spec_error({**BASE, "apply": {"verifyWindow": "5m"},
                          "prometheus": {"url": "http://prom:9090"}}) is None
