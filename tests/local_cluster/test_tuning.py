"""Closed-loop tuning in the local cluster: a PagedInferenceTuning applied with kubectl
becomes the operator's tuner Job, whose trials are real PagedInferenceServices run by the
process kubelet, measured with real Locust, decided with intervals, and applied. The
engines are the stand-in of tests/local_cluster/fake_engine_pkg (tuning_harness.py).
Tunings that read the live traffic with PromQL or share a study in PostgreSQL:
test_tuning_live.py.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cluster_harness import LocalCluster, alive
from tuning_harness import (AUTOSCALING, AUTOSCALING_DEFAULTS, ENGINE_DEFAULTS, PREVIOUS,
                            apply, engine_of, finished, hpa_target, service, target,
                            trial_services, tuning)

pytestmark = pytest.mark.xdist_group("local_cluster_tuning")
__all__ = ["target"]   # the module's target service (a fixture)


def test_manual_tuning_searches_confirms_and_recommends(target: LocalCluster) -> None:
    apply(target, tuning("manual", "chat", trials=4, parallelism=2,
                         space={"maxNumSeqs": [4, 16], "blockSize": [8, 16]}))
    status = finished(target, "manual")["status"]
    # the search: all four combinations (a small all-choices space is exhaustive), the two
    # with blockSize 8 infeasible with the engine's own message
    assert status["trialsText"] == "4/4"
    infeasible = [t for t in status["history"] if "infeasible" in t]
    assert sorted(t["engine"]["blockSize"] for t in infeasible) == [8, 8]
    assert all("CUDA out of memory" in t["infeasible"] for t in infeasible)
    # the decision: maxNumSeqs 4 beats the target's 16, with an interval above 1.1
    assert status["best"]["engine"] == {"blockSize": 16, "maxNumSeqs": 4}
    assert status["gain"]["low"] > 1.1 and status["gain"]["low"] <= status["gain"]["ratio"]
    assert status["baseline"]["engine"]["maxNumSeqs"] == 16
    assert status["baseline"]["goodput"] == 0 < status["best"]["goodput"]
    assert len(status["baseline"]["goodputInterval"]) == 2
    assert status["decision"]["winner"] == "C1"
    assert status["pareto"][0]["engine"]["maxNumSeqs"] == 4
    # Manual: a recommendation, the target untouched
    assert status["applied"] == "Manual"
    patch = yaml.safe_load(target.json("get", "cm", "manual-recommendation")["data"]
                           ["patch.yaml"])
    assert patch == {"spec": {"engine": {"blockSize": 16, "maxNumSeqs": 4}}}
    assert engine_of(target, "chat") == {**ENGINE_DEFAULTS, "blockSize": 16,
                                         "maxNumSeqs": 16}
    assert trial_services(target, "manual") == []
    target.kubectl("wait", "job/manual-tuner", "--for=condition=Complete", "--timeout=30s",
                   timeout=40)
    role = target.json("get", "role", "manual-tuner")
    assert {"pagedinferenceservices"} in [set(r["resources"]) for r in role["rules"]]
    # printer columns
    printed = target.kubectl("get", "pit", "manual").stdout.splitlines()[1]
    assert "4/4" in printed and "Manual" in printed and "Succeeded" in printed


def test_unreachable_min_gain_changes_nothing_and_a_gain_that_does_not_hold_rolls_back(
        target: LocalCluster) -> None:
    """Two tunings at once, on two services (one Job each)."""
    apply(target, service("slow", slow_hosts="slow-", autoscaling=AUTOSCALING))
    target.kubectl("wait", "pis/slow", "--for=condition=Ready", "--timeout=90s", timeout=100)
    apply(target, tuning("unreachable", "chat", trials=1, mode="Auto", min_gain=1000,
                         space={"maxNumSeqs": [4]}),
          tuning("regress", "slow", trials=1, mode="Auto", min_gain=1.2,
                 space={"maxNumSeqs": [4]}, capacity={"maxProbes": 2}))
    # regress: the apply sets the autoscaler's target from the capacity, with the engine
    # settings; the verification fails on the slow pods and both are rolled back
    applied = target.wait_for(lambda: (t := hpa_target(target, "slow")) != "50" and t, 150,
                              "the autoscaler's target applied on slow")
    assert target.json("get", "pis", "slow")["spec"]["autoscaling"]["target"] == applied
    status = finished(target, "unreachable")["status"]
    assert status["applied"] == "No" and status["decision"].get("winner") is None
    assert "minGain 1000" in status["decision"]["reason"]
    assert status["gain"]["low"] > 1   # a real gain, just not the one asked for
    assert engine_of(target, "chat") == {**ENGINE_DEFAULTS, "blockSize": 16,
                                         "maxNumSeqs": 16}

    status = finished(target, "regress")["status"]
    assert status["applied"] == "RolledBack", status
    assert status["verification"]["held"] is False
    assert "rolled back" in status["decision"]["reason"]
    assert status["capacity"]["autoscaling"]["target"] == applied
    assert status["appliedAutoscaling"] == {"target": applied}
    live = target.json("get", "pis", "slow")
    assert live["spec"]["engine"] == {**ENGINE_DEFAULTS, "blockSize": 16, "maxNumSeqs": 16}
    assert live["spec"]["autoscaling"] == {**AUTOSCALING_DEFAULTS, **AUTOSCALING}
    assert PREVIOUS not in (live["metadata"].get("annotations") or {})
    target.wait_for(lambda: hpa_target(target, "slow") == "50", 30, "the HPA restored")
    target.kubectl("delete", "pis", "slow", "--wait=false")


def test_auto_applies_the_winner_and_rolls_the_pods(target: LocalCluster) -> None:
    before = {p["metadata"]["name"] for p in target.pods("app.kubernetes.io/instance=chat")}
    apply(target, tuning("auto", "chat", trials=1, mode="Auto", min_gain=1.2,
                         space={"maxNumSeqs": [4]}, capacity={"maxProbes": 2}))
    status = finished(target, "auto")["status"]
    assert status["applied"] == "Yes", status
    assert status["verification"]["held"] is True
    # capacity: open-loop probes on one replica with the winning settings, and the
    # autoscaler's queueDepth target they imply, applied with the engine settings
    capacity = status["capacity"]
    assert capacity["engine"] == {**ENGINE_DEFAULTS, "blockSize": 16, "maxNumSeqs": 4}
    assert capacity["ratePerReplica"] > 0 and 1 <= len(capacity["probes"]) <= 2
    goal = capacity["autoscaling"]["target"]
    assert capacity["autoscaling"]["metric"] == "queueDepth" and float(goal) > 0
    live = target.json("get", "pis", "chat")
    assert live["spec"]["engine"] == {**ENGINE_DEFAULTS, "blockSize": 16, "maxNumSeqs": 4}
    assert live["spec"]["autoscaling"] == {**AUTOSCALING_DEFAULTS, **AUTOSCALING,
                                           "target": goal}
    assert status["recommendation"]["patch"]["spec"]["autoscaling"] == {"target": goal}
    target.wait_for(lambda: hpa_target(target, "chat") == goal, 30, "the HPA's new target")
    notes = live["metadata"]["annotations"]
    assert json.loads(notes[PREVIOUS]) == {
        "engine": {**ENGINE_DEFAULTS, "blockSize": 16, "maxNumSeqs": 16},
        "autoscaling": {"target": "50"}}
    assert notes["serving.pagedinference.dev/applied-by"] == "auto"
    now = {p["metadata"]["name"] for p in target.pods("app.kubernetes.io/instance=chat")
           if not p["metadata"].get("deletionTimestamp")}
    assert now and not now & before   # the pod was rolled


def test_deleting_mid_run_leaves_no_trial_and_no_process(target: LocalCluster) -> None:
    apply(target, tuning("doomed", "chat", trials=3, duration="60s",
                       space={"maxNumSeqs": [4, 8, 16]}))

    def running_trial() -> list[dict]:
        pods = [p for p in target.pods("app.kubernetes.io/instance=doomed-t0")
                if (p.get("status") or {}).get("containerStatuses")]
        return pods if pods and pods[0]["status"]["containerStatuses"][0].get("ready") else []
    (trial_pod,) = target.wait_for(running_trial, 90, "a trial engine serving")
    (job_pod,) = target.pods("app.kubernetes.io/instance=doomed,"
                             "app.kubernetes.io/component=tuner")
    pids = [int(p["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
            for p in (trial_pod, job_pod)]
    assert all(alive(pid) for pid in pids)
    target.kubectl("delete", "pit", "doomed", timeout=90)
    target.wait_for(lambda: not trial_services(target, "doomed"), 60, "trials deleted")
    target.wait_for(lambda: not any(alive(pid) for pid in pids), 60, "processes gone")
    target.wait_for(lambda: not target.kubectl("get", "job", "doomed-tuner",
                                               check=False).returncode == 0, 30, "Job gone")


def test_suspend_stops_the_job_its_load_workers_and_trials_and_unsuspend_makes_them_again(
        target: LocalCluster) -> None:
    """spec.suspend: the Job, the load-worker pods with their Service and the trial
    services go; suspend false makes a new Job and new workers."""
    apply(target, tuning("pause", "chat", trials=3, duration="60s", loadWorkers=2,
                         space={"maxNumSeqs": [4, 8, 16]}))
    workers = "app.kubernetes.io/instance=pause,app.kubernetes.io/component=load-worker"

    def under_way() -> bool:
        running = [p for p in target.pods(workers)
                   if (p.get("status") or {}).get("phase") == "Running"]
        return len(running) == 2 and bool(trial_services(target, "pause"))
    target.wait_for(under_way, 90, "two running load workers and a trial")
    first = {p["metadata"]["name"] for p in target.pods(workers)}
    target.kubectl("patch", "pit", "pause", "--type=merge", "-p", '{"spec": {"suspend": true}}')

    def gone() -> bool:
        return (not target.pods(workers) and not trial_services(target, "pause")
                and all(target.kubectl("get", kind, name, check=False).returncode
                        for kind, name in (("deploy", "pause-load"), ("svc", "pause-load"),
                                           ("job", "pause-tuner"))))
    target.wait_for(gone, 90, "the Job, the load workers and the trials to go")
    target.kubectl("patch", "pit", "pause", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    again = target.wait_for(lambda: len(target.pods(workers)) == 2 and target.kubectl(
        "get", "job", "pause-tuner", check=False).returncode == 0 and target.pods(workers),
        90, "a new Job and two new load workers")
    assert not first & {p["metadata"]["name"] for p in again}
    target.kubectl("delete", "pit", "pause", timeout=90)
    target.wait_for(lambda: not target.pods(workers) and not trial_services(target, "pause"),
                    90, "everything of the tuning to go")


def test_a_killed_job_pod_resumes_without_re_running_finished_trials(
        target: LocalCluster) -> None:
    apply(target, tuning("resume", "chat", trials=3, space={"maxNumSeqs": [4, 8, 16]}))
    selector = "app.kubernetes.io/instance=resume,app.kubernetes.io/component=tuner"

    def mid_search() -> dict | None:   # trial 0 recorded, trial 1 under way
        status = target.json("get", "pit", "resume").get("status") or {}
        return status if status.get("history") and "resume-t1" in \
            trial_services(target, "resume") else None
    before = target.wait_for(mid_search, 90, "the second trial")["history"]
    (first,) = target.pods(selector)
    pid = int(first["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
    os.killpg(pid, signal.SIGKILL)   # the node lost it: no SIGTERM, no clean-up
    status = finished(target, "resume")["status"]
    pods = {p["metadata"]["name"]: p for p in target.pods(selector)}
    assert len(pods) == 2 and pods[first["metadata"]["name"]]["status"]["phase"] == "Failed"
    (second,) = set(pods) - {first["metadata"]["name"]}
    log = target.kubectl("logs", second).stdout
    # the finished trials came back from status.history, unchanged and not measured again
    assert status["history"][:len(before)] == before
    for entry in before:
        assert f"resume-t{entry['trial']}: ready" not in log
    assert "resume-t2: ready" in log
    assert sorted(e["params"]["max_num_seqs"] for e in status["history"]) == [4, 8, 16]
    assert status["trialsText"] == "3/3" and trial_services(target, "resume") == []


def test_a_target_with_an_api_key_is_loaded_with_its_key(target: LocalCluster) -> None:
    """The operator mounts the target's apiKeySecretRef into the Job (no Role rule on
    Secrets); the load and warm-up send it. A Secret that is not there fails the tuning."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keyed-key"},
              "stringData": {"api-key": "sk-tune"}}
    keyed, nokey = service("keyed"), service("nokey")
    keyed["spec"]["apiKeySecretRef"] = {"name": "keyed-key"}
    nokey["spec"]["apiKeySecretRef"] = {"name": "absent-key"}
    apply(target, secret, keyed, nokey)
    apply(target, tuning("keyed", "keyed", trials=1, space={"maxNumSeqs": [4]}),
          tuning("nokey", "nokey", trials=1, space={"maxNumSeqs": [4]}))
    status = finished(target, "keyed")["status"]
    assert status["history"][0]["goodput"] > 0 and status["gain"]["low"] > 1.1, status
    request = urllib.request.Request(target.service_url("keyed") + "/v1/models")
    with pytest.raises(urllib.error.HTTPError) as refused:   # the key is really required
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    (volume,) = [v for v in target.json("get", "job", "keyed-tuner")["spec"]["template"]
                 ["spec"]["volumes"] if v["name"] == "api-key"]
    assert volume["secret"]["secretName"] == "keyed-key"
    assert not [r for r in target.json("get", "role", "keyed-tuner")["rules"]
                if "secrets" in r["resources"]]

    failed = target.wait_for(lambda: (s := target.json("get", "pit", "nokey").get("status")
                                      or {}).get("phase") == "Failed" and s, 60, "nokey fails")
    assert "'absent-key'" in failed["decision"]["reason"]
    assert "missing or empty" in failed["decision"]["reason"]
    target.kubectl("delete", "pis", "keyed", "nokey", "--wait=false")


@pytest.fixture
def request_logs() -> Iterator[Path]:
    """Where the fake engines log the requests they receive: outside /tmp, which the
    local kubelet maps to each pod's own emptyDir."""
    path = Path(tempfile.mkdtemp(prefix="paged-tuning-requests-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def served(logs: Path, prefix: str) -> dict[str, list[dict]]:
    """Per pod whose name starts with `prefix`: the load's requests it received (the
    warm-up's text prompts left out)."""
    out = {}
    for path in sorted(logs.glob(f"{prefix}*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        out[path.stem] = [r for r in lines if isinstance(r["prompt"], list)]
    return {pod: reqs for pod, reqs in out.items() if reqs}


def test_a_trace_in_a_config_map_replays_on_two_load_workers(
        target: LocalCluster, request_logs: Path) -> None:
    """spec.workloadFrom.trace.configMapRef, mounted into the Job; spec.loadWorkers 2:
    Locust's master in the Job's pod and two load-worker pods, whose samples merge into
    one set per measurement."""
    trace = [{"timestamp": round(0.3 * i, 2), "prompt_tokens": 24, "output_tokens": 3 + i,
              "prefix_group": "sys-a" if i % 3 else "sys-b", "prefix_tokens": 16}
             for i in range(10)]   # output_tokens name the request in the engine's log
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "replay-trace"},
                  "data": {"requests.jsonl": "".join(json.dumps(r) + "\n" for r in trace)}}
    apply(target, config_map, service("replay", request_log=str(request_logs)))
    target.kubectl("wait", "pis/replay", "--for=condition=Ready", "--timeout=90s", timeout=100)
    seen: dict[str, str] = {}   # load-worker pod -> its log, while it runs
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            for pod in target.pods("app.kubernetes.io/instance=replay,"
                                   "app.kubernetes.io/component=load-worker"):
                log = (target.dir / "pods" / "default" / pod["metadata"]["name"] / "logs" /
                       "load-worker.log")
                try:
                    seen[pod["metadata"]["name"]] = log.read_text()
                except OSError:
                    pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    apply(target, tuning("replay", "replay", trials=1, space={"maxNumSeqs": [4]},
                         duration="5s", workload=None, users=None, lengthScale=None,
                         loadWorkers=2, workloadFrom={"trace": {"configMapRef": {
                             "name": "replay-trace", "key": "requests.jsonl"}}}))
    try:
        status = finished(target, "replay")["status"]
    finally:
        stop.set()
        watcher.join()
    workload = status["workload"]
    assert workload["source"] == "workloadFrom.trace" and workload["loadWorkers"] == 2
    assert "prefix groups: 2 holding 10 of 10 requests" in workload["document"]
    assert "the ConfigMap 'replay-trace'" in workload["document"]
    # one merged sample set per measurement, as many samples as the engine served
    assert status["history"][0]["requests"] == len(trace)
    pods = served(request_logs, "replay-")
    assert len(pods) == 5, pods.keys()   # the search trial, 2 rounds x (baseline, C1)
    (search_pod,) = [p for p in pods if p.startswith("replay-t0-")]
    for pod, requests in pods.items():
        assert len(requests) == len(trace), pod
        # the prefix groups: one shared opening per group, two groups
        openings = {r["max_tokens"] - 3: tuple(r["prompt"]) for r in requests}
        assert len(set(openings.values())) == 2
        assert {openings[i] for i in range(10) if i % 3} != {openings[0]}
        # arrival order and times: the trace's, within the two workers' start skew and the
        # loaded CI machine's scheduling (0.26 s seen once with the suite on both cores): a
        # replay that sent everything at once would be 2.7 s off by the last request, one
        # on another clock (its timestamps scaled by 1.25 or more) 0.67 s
        requests.sort(key=lambda r: r["t"])
        assert [r["max_tokens"] - 3 for r in requests] == list(range(10)), pod
        start = requests[0]["t"]
        for r, want in zip(requests, trace):
            assert abs((r["t"] - start) - want["timestamp"]) < 0.5, (pod, r, want)
    assert len(pods[search_pod]) == status["history"][0]["requests"]
    # the two workers were pods, which found the Job pod's master through the Service's
    # variables and served every measurement (the search trial, 2 rounds x 2): none ran in
    # the Job's pod
    (job_pod,) = target.pods("app.kubernetes.io/instance=replay,"
                             "app.kubernetes.io/component=tuner")
    trial_dir = (target.dir / "pods" / "default" / job_pod["metadata"]["name"] / "volumes" /
                 "tmp" / "tuner-out" / "replay" / "trials" / "trial-0000")
    assert (trial_dir / "samples.jsonl").is_file()
    assert not list(trial_dir.glob("locust-worker-*.log"))
    assert len(seen) == 2 and all(p.startswith("replay-load-") for p in seen), seen
    for pod, log in seen.items():
        assert "Locust master at 127.0.1." in log and ":5557, workload trace" in log, log
        assert "run 4 ended (0)" in log, (pod, log)
    # the Job is done: the operator deleted the workers and their Service
    target.wait_for(lambda: not target.pods("app.kubernetes.io/instance=replay,"
                                            "app.kubernetes.io/component=load-worker")
                    and all(target.kubectl("get", kind, "replay-load", check=False).returncode
                            for kind in ("deploy", "svc")),
                    60, "the load workers to go")
    job = target.json("get", "job", "replay-tuner")["spec"]["template"]["spec"]
    (volume,) = [v for v in job["volumes"] if v["name"] == "trace"]
    assert volume["configMap"]["name"] == "replay-trace"
    target.kubectl("delete", "pis", "replay", "--wait=false")


def test_a_spec_no_job_can_run_is_refused_at_admission_and_runs_once_fixed(
        target: LocalCluster) -> None:
    """Both spec.workload and spec.workloadFrom; workloadFrom.prometheus without
    spec.prometheus.url. The API server refuses both with the CRD's CEL messages, as a
    real one does (the operator's own check of the same rules: tests/operator); once
    fixed, the Job runs and reports what it could not do."""
    both = tuning("both", "chat", trials=1, space={"maxNumSeqs": [4]},
                  workloadFrom={"trace": {"url": "http://127.0.0.1:9/trace.jsonl"}})
    noprom = tuning("noprom", "chat", trials=1, space={"maxNumSeqs": [4]}, workload=None,
                    workloadFrom={"prometheus": {"window": "1h"}})
    for body, message in ((both, "give spec.workload or spec.workloadFrom, not both"),
                          (noprom, "spec.workloadFrom.prometheus needs spec.prometheus.url")):
        done = target.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body), check=False)
        name = body["metadata"]["name"]
        assert done.returncode == 1 and done.stderr.startswith(
            f'The PagedInferenceTuning "{name}" is invalid: spec: Invalid value: "object": '
            f"{message}"), done.stderr
        assert target.kubectl("get", "pit", name, check=False).returncode != 0

    def refused(name: str) -> dict | None:
        status = target.json("get", "pit", name).get("status") or {}
        return status if status.get("phase") == "Failed" else None
    # fixed: the Job starts, and finds no histograms to fit in this Prometheus
    noprom["spec"]["prometheus"] = {"url": target.info["prometheus"]}
    apply(target, noprom)
    target.wait_for(lambda: target.kubectl("get", "job", "noprom-tuner",
                                           check=False).returncode == 0, 30, "the Job")
    status = target.wait_for(lambda: (s := refused("noprom")) and "no workload could be "
                             "fitted" in s["decision"]["reason"] and s, 90, "the fit's error")
    assert status["decision"]["reason"].startswith("spec.workloadFrom.prometheus: ")
    assert [c["status"] for c in status["conditions"]] == ["True"]
    target.kubectl("delete", "pit", "noprom", "--wait=false")
