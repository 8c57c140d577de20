"""The whole path on the local cluster: kubectl applies examples/service-cpu.yaml, the real
operator makes a Deployment, the process kubelet runs the engine, the real `openai` client
gets a completion through the Service's address, and Prometheus scrapes the engine."""
from __future__ import annotations

import json
import socket
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest

from cluster_harness import ROOT, LocalCluster, alive

from localcluster.kubelet.node import CLAIMS

# one local cluster per module: keep the module on one xdist worker
pytestmark = pytest.mark.xdist_group("local_cluster_engine")

LOCAL_CLUSTER_ARGS = ["--no-postgres"]


SELECTOR = "app.kubernetes.io/instance=tiny"


def cmdline(pod: dict) -> list[str]:
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def ready_pods(cluster: LocalCluster) -> list[dict]:
    return [p for p in cluster.pods(SELECTOR) if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions", []))]


def claim_of(address: str) -> str | None:
    """Which process holds the address machine-wide (localcluster/kubelet/node.py)."""
    try:
        return (CLAIMS / address.rsplit(":", 1)[0]).read_text()
    except OSError:
        return None


def port_in_use(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def promql(cluster: LocalCluster, query: str) -> list[dict]:
    url = f"{cluster.info['prometheus']}/api/v1/query?query={urllib.parse.quote(query)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


@pytest.fixture(scope="module")
def tiny(local_cluster: LocalCluster) -> LocalCluster:
    # `broken` (the Degraded case) starts beside tiny: its engine fails while tiny's loads
    broken = (ROOT / "examples/service-cpu.yaml").read_text().replace(
        "name: tiny", "name: broken").replace("builtin://default", "/models/missing")
    local_cluster.kubectl("apply", "-f", "-", stdin=broken)
    local_cluster.kubectl("apply", "-f", str(ROOT / "examples/service-cpu.yaml"))
    local_cluster.kubectl("wait", "pis/tiny", "--for=condition=Ready", "--timeout=180s",
                          timeout=200)
    return local_cluster


def test_an_engine_that_cannot_start_ends_degraded(tiny: LocalCluster) -> None:
    tiny.kubectl("wait", "pis/broken", "--for=condition=Degraded", "--timeout=120s",
                 timeout=130)
    status = tiny.json("get", "pis", "broken")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "EngineFailing"
    assert "/models/missing" in degraded["message"]   # the engine's own last error
    assert "exited with code" in degraded["message"]
    tiny.kubectl("delete", "pis", "broken", "--timeout=60s", timeout=70)
    tiny.wait_for(lambda: not tiny.pods("app.kubernetes.io/instance=broken"), 60,
                  "the broken pod to go")


def test_completion_through_the_service_address(tiny: LocalCluster) -> None:
    client = openai.OpenAI(base_url=tiny.service_url("tiny") + "/v1", api_key="unused")
    done = client.completions.create(model="tiny", prompt="Hello", max_tokens=4)
    assert done.usage.completion_tokens == 4 and done.choices[0].text
    (pod,) = ready_pods(tiny)
    argv = cmdline(pod)
    assert argv[argv.index("--host") + 1] == pod["status"]["podIP"]   # rebound from 0.0.0.0
    assert "engine" in tiny.kubectl("logs", pod["metadata"]["name"]).stdout


def test_prometheus_scrapes_the_engine(tiny: LocalCluster) -> None:
    (pod,) = ready_pods(tiny)
    name = pod["metadata"]["name"]
    result = tiny.wait_for(lambda: promql(tiny, f'vllm:num_requests_running{{pod="{name}"}}'),
                           30, "Prometheus to scrape the engine")
    assert result[0]["metric"]["namespace"] == "default"


def test_patch_rolls_the_pod_with_the_new_block_size(tiny: LocalCluster) -> None:
    (old,) = ready_pods(tiny)
    tiny.kubectl("patch", "pis", "tiny", "--type=merge",
                 "-p", '{"spec": {"engine": {"blockSize": 32}}}')
    new = tiny.wait_for(lambda: [p for p in ready_pods(tiny) if p["metadata"]["name"]
                                 != old["metadata"]["name"]], 180, "the rolled pod")
    argv = cmdline(new[0])
    assert argv[argv.index("--block-size") + 1] == "32"
    tiny.wait_for(lambda: len(tiny.pods(SELECTOR)) == 1, 60, "the old pod to go")
    tiny.kubectl("wait", "pis/tiny", "--for=condition=Ready", "--timeout=60s")


def test_scale_to_two_serving_processes(tiny: LocalCluster) -> None:
    tiny.kubectl("scale", "pis/tiny", "--replicas=2")
    pods = tiny.wait_for(lambda: len(p := ready_pods(tiny)) == 2 and p, 180, "two ready pods")
    pids = {p["status"]["containerStatuses"][0]["containerID"] for p in pods}
    assert len(pids) == 2
    for pod in pods:   # each process serves on its own loopback address
        url = f"http://{pod['status']['podIP']}:8000/v1/models"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert json.load(response)["data"][0]["id"] == "tiny"


def test_delete_leaves_nothing(tiny: LocalCluster) -> None:
    pods = tiny.pods(SELECTOR)
    pids = [int(p["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
            for p in pods]
    addresses = [f"{p['status']['podIP']}:8000" for p in pods]
    addresses.append(tiny.info["services"]["default/tiny"]["ports"]["http"])
    claims = {a: claim_of(a) for a in addresses}
    tiny.kubectl("delete", "pis", "tiny", "--timeout=90s", timeout=100)
    tiny.wait_for(lambda: not tiny.pods(SELECTOR), 90, "the pods to go")
    assert not any(alive(p) for p in pids)
    left = tiny.kubectl("get", "deploy,rs,svc,cm,endpointslices,podmonitors,pdb,netpol",
                        "-o", "name").stdout
    assert left == ""
    # closed, or the address given back and already claimed by another local cluster (tests
    # run clusters side by side; the pool hands out the lowest free address)
    tiny.wait_for(lambda: all(not port_in_use(a) or claim_of(a) not in (None, claims[a])
                              for a in addresses), 10, "the ports to close")
    assert "default/tiny" not in tiny.info["services"]
