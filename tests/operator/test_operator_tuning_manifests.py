"""What a PagedInferenceTuning becomes, pinned without a cluster: the Job's trace mount
(spec.workloadFrom.trace.configMapRef), the load-worker pods and Services of
spec.loadWorkers, the Role (still only the loop's calls), and the specs the operator
refuses before making any Job."""
from __future__ import annotations

import pytest

from paged_operator import tuning_manifests as tm
from paged_api.contract import spec_error

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


def children_of(**spec):
    return tm.children("tune", "team", {**BASE, **spec}, image="engine:1",
                       api_key=spec.pop("_api_key", None))


@pytest.mark.parametrize("workers", [None, 1])
def test_one_load_worker_is_locust_in_the_jobs_pod_with_no_pods_of_its_own(workers):
    spec = {} if workers is None else {"loadWorkers": workers}
    kinds = [c["kind"] for c in children_of(**spec)]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "Job"]
    (container,) = job_of(**spec)["containers"]
    assert "ports" not in container
    assert not {"POD_IP", "TUNER_LOCUST_MASTER_PORT"} & {e["name"] for e in container["env"]}
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "512Mi"}


@pytest.mark.parametrize("spec, workload", [
    ({"workload": "rag"}, "rag"), ({}, "chat"),
    ({"workloadFrom": {"trace": {"url": "https://x/t.jsonl"}}}, "trace"),
    ({"workloadFrom": {"prometheus": {}}, "prometheus": {"url": "http://p"}}, "trace")])
def test_load_workers_are_pods_that_find_the_jobs_master_through_a_service(spec, workload):
    made = children_of(loadWorkers=3, **spec)
    assert [c["kind"] for c in made] == ["ServiceAccount", "Role", "RoleBinding", "Service",
                                         "Deployment", "Job"]   # the Service before its pods
    service, deployment, job = made[3:]
    assert service["metadata"]["name"] == deployment["metadata"]["name"] == "tune-load"
    template = job["spec"]["template"]
    # the Service selects the Job's pod, by the port the Job's container names
    assert service["spec"]["selector"] == template["metadata"]["labels"]
    (port,) = service["spec"]["ports"]
    (container,) = template["spec"]["containers"]
    assert container["ports"] == [{"name": port["targetPort"], "containerPort": 5557,
                                   "protocol": "TCP"}] and port["port"] == 5557
    env = {e["name"]: e for e in container["env"]}
    assert env["TUNER_LOCUST_MASTER_PORT"]["value"] == "5557"
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert container["resources"]["requests"]["cpu"] == "1"   # the workers are not in it
    # the worker pods: not selected by the Service, no API access, the tuning's locustfile
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    assert not set(service["spec"]["selector"].items()) <= set(pod["metadata"]["labels"].items())
    assert pod["spec"]["automountServiceAccountToken"] is False
    (worker,) = pod["spec"]["containers"]
    assert worker["command"] == ["python", "-m", "tuner", "load-worker", "--master-service",
                                 "tune-load", "--workload", workload]
    assert worker["image"] == "engine:1" and worker["resources"]["requests"]["cpu"] == "1"
    assert "TUNER_API_KEY_FILE" not in {e["name"] for e in worker["env"]}


def test_each_tuner_pod_gets_its_own_master_service_and_workers():
    made = children_of(loadWorkers=2, tunerPods=2, storage={"secretRef": {"name": "db"}})
    services = [c for c in made if c["kind"] == "Service"]
    deployments = [c for c in made if c["kind"] == "Deployment"]
    assert [s["metadata"]["name"] for s in services] == ["tune-load-0", "tune-load-1"]
    assert [d["metadata"]["name"] for d in deployments] == ["tune-load-0", "tune-load-1"]
    for i, (service, deployment) in enumerate(zip(services, deployments)):
        assert service["spec"]["selector"][tm.INDEX_LABEL] == str(i)
        command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[command.index("--master-service") + 1] == f"tune-load-{i}"
        assert deployment["spec"]["replicas"] == 2
    labels = [d["spec"]["template"]["metadata"]["labels"] for d in deployments]
    assert labels[0] != labels[1]   # each Deployment's selector holds only its own pods


def test_load_worker_pods_send_the_targets_api_key():
    made = children_of(loadWorkers=2, _api_key={"name": "key", "key": "token"})
    (deployment,) = [c for c in made if c["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-key"]
    assert volume["secret"]["secretName"] == "key"
    assert volume["secret"]["items"] == [{"key": "token", "path": "api-key"}]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "api-key"]
    assert env["TUNER_API_KEY_FILE"].startswith(mount["mountPath"])


def test_the_role_still_allows_only_the_loops_calls():
    """The trace comes as a mount and the operator makes the load-worker pods: no rule on
    pods, services or deployments, on reading ConfigMaps, or on Secrets."""
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
    assert spec_error({**BASE, **spec}) is None


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
    assert field in (spec_error({**BASE, **spec}) or "")


def test_several_tuner_pods_make_an_indexed_job_and_one_pod_a_plain_one():
    store = {"storage": {"secretRef": {"name": "optuna-db"}}}
    job = tm.job("tune", "team", {**BASE, **store, "tunerPods": 3}, image="engine:1")["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 3, 3)
    (env,) = [e for e in job["template"]["spec"]["containers"][0]["env"]
              if e["name"] == "TUNER_STORAGE_URL"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "optuna-db", "key": "url"}
    single = tm.job("tune", "team", {**BASE, **store, "tunerPods": 1}, image="engine:1")["spec"]
    assert "completionMode" not in single and "parallelism" not in single
    assert spec_error({**BASE, **store, "tunerPods": 3}) is None
    assert "spec.tunerPods 3 needs spec.storage.secretRef" in \
        spec_error({**BASE, "tunerPods": 3})


def test_a_verify_window_needs_a_prometheus():
    assert "spec.apply.verifyWindow needs spec.prometheus.url" in \
        spec_error({**BASE, "apply": {"verifyWindow": "5m"}})
    assert spec_error({**BASE, "apply": {"verifyWindow": "5m"},
                          "prometheus": {"url": "http://prom:9090"}}) is None
