"""spec.router.policy: precise on the local cluster, with the stand-in engine
(tests/local_cluster/fake_engine_pkg, which ignores --kv-events-config): the engine pods run
with the KV-events flag and named event ports, the engines' headless Service and its
EndpointSlice carry those ports (what the router's discovery reads), the router runs
`--policy precise` (no --tokenizer: it fetches the engines'), and a NetworkPolicy opens the event ports to the
router pods only; back to `prefix`, that NetworkPolicy, the flag and the ports go."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_harness import LocalCluster
from tuning_harness import service

pytestmark = pytest.mark.xdist_group("local_cluster_router_precise")

LOCAL_CLUSTER_ARGS = ["--no-postgres"]
NAME = "precise"
ENGINES = f"app.kubernetes.io/name=paged-inference-engine,app.kubernetes.io/instance={NAME}"
ROUTER_LABELS = {"app.kubernetes.io/name": "paged-inference-router",
                 "app.kubernetes.io/instance": NAME}


def manifest(policy: str) -> str:
    body = service(NAME)
    body["spec"]["replicas"] = 2
    body["spec"]["router"] = {"enabled": True, "policy": policy}
    return json.dumps(body)


def get(cluster: LocalCluster, *args: str) -> dict | None:
    done = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def port_names(obj: dict | None) -> dict[str, int]:
    return {p["name"]: p["port"] for p in (obj or {}).get("ports") or []}


def running_args(cluster: LocalCluster) -> list[list[str]]:
    """argv of each running engine process (what the kubelet started)."""
    out = []
    for pod in cluster.pods(ENGINES):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if statuses and statuses[0].get("containerID", "").startswith("local://") \
                and statuses[0].get("ready"):
            pid = int(statuses[0]["containerID"].removeprefix("local://"))
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_text().split("\0"))
            except OSError:
                continue
    return out


def test_precise_then_back_to_prefix(local_cluster: LocalCluster) -> None:
    c = local_cluster
    c.kubectl("apply", "-f", "-", stdin=manifest("precise"))
    policy = c.wait_for(lambda: get(c, "networkpolicy", f"{NAME}-kv-events"), 120,
                        "the KV-events NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "paged-inference-engine", "app.kubernetes.io/instance": NAME}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": ROUTER_LABELS}}]
    assert sorted(p["port"] for p in rule["ports"]) == ["kv-events", "kv-replay"]
    assert get(c, "networkpolicy", NAME) is not None  # the main policy stays beside it

    # both engine processes run with the flag; their EndpointSlice names the event ports
    def engines_with_flag() -> bool:
        argvs = running_args(c)
        return len(argvs) == 2 and all("--kv-events-config" in a for a in argvs)
    c.wait_for(engines_with_flag, 180, "two engine processes with --kv-events-config")
    config = json.loads(next(iter(running_args(c)))[
        running_args(c)[0].index("--kv-events-config") + 1])
    assert (config["endpoint"], config["replay_endpoint"]) == ("tcp://*:5557", "tcp://*:5558")
    pod = c.pods(ENGINES)[0]
    assert {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]} == \
        {"http": 8000, "kv-events": 5557, "kv-replay": 5558}
    engine_svc = get(c, "service", f"{NAME}-engine")
    assert port_names(engine_svc["spec"]) == {"http": 8000, "kv-events": 5557, "kv-replay": 5558}
    slice_ = c.wait_for(lambda: (lambda s: s if port_names(s) == {
        "http": 8000, "kv-events": 5557, "kv-replay": 5558} and sum(
            e["conditions"].get("ready") is True for e in s.get("endpoints") or []) == 2
        else None)(get(c, "endpointslice", f"{NAME}-engine-local")), 60,
        "the engines' EndpointSlice with the event ports and two ready endpoints")
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == f"{NAME}-engine"
    router = get(c, "deployment", f"{NAME}-router")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--policy") + 1] == "precise"
    assert "--tokenizer" not in args
    assert ROUTER_LABELS.items() <= router["spec"]["template"]["metadata"]["labels"].items()

    # back to the prefix policy: the event policy, ports and flag go
    c.kubectl("apply", "-f", "-", stdin=manifest("prefix"))
    c.wait_for(lambda: get(c, "networkpolicy", f"{NAME}-kv-events") is None, 120,
               "the KV-events NetworkPolicy to be deleted")
    assert get(c, "networkpolicy", NAME) is not None
    assert port_names(get(c, "service", f"{NAME}-engine")["spec"]) == {"http": 8000}
    deployment = get(c, "deployment", NAME)
    assert "--kv-events-config" not in deployment["spec"]["template"]["spec"]["containers"][0][
        "args"]
    c.wait_for(lambda: (lambda argvs: len(argvs) == 2 and not any(
        "--kv-events-config" in a for a in argvs))(running_args(c)), 180,
        "two engine processes without --kv-events-config")
    args = get(c, "deployment", f"{NAME}-router")["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert args[args.index("--policy") + 1] == "prefix" and "--tokenizer" not in args
    c.kubectl("delete", "pis", NAME, "--timeout=90s", timeout=100)
    c.wait_for(lambda: not c.pods(f"app.kubernetes.io/instance={NAME}"), 90, "the pods to go")
    assert NAME not in c.kubectl("get", "netpol,svc,deploy", "-o", "name").stdout
