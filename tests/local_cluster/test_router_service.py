"""A PagedInferenceService with an API key from a Secret and the router in front, on the local
cluster: the engines read the key from the mounted Secret file, the router (its own
Deployment) discovers the engine pods through the EndpointSlices of `<name>-engine` and
follows a scale-up, a scale-down under load fails no request, and deleting the service
leaves nothing."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml
from cluster_harness import ROOT, LocalCluster, alive

# one local cluster per module: keep the module on one xdist worker
pytestmark = pytest.mark.xdist_group("local_cluster_router")

LOCAL_CLUSTER_ARGS = ["--no-postgres"]
KEY = "sk-local-cluster-test"
ENGINES = "app.kubernetes.io/name=paged-inference-engine,app.kubernetes.io/instance=routed"
ROUTERS = "app.kubernetes.io/name=paged-inference-router,app.kubernetes.io/instance=routed"
SECRET = f"""
apiVersion: v1
kind: Secret
metadata: {{name: routed-key}}
type: Opaque
stringData: {{token: {KEY}}}
"""


def manifest() -> str:
    doc = yaml.safe_load((ROOT / "examples/service-cpu.yaml").read_text())
    doc["metadata"]["name"] = "routed"
    doc["spec"]["replicas"] = 2
    doc["spec"]["apiKeySecretRef"] = {"name": "routed-key", "key": "token"}
    doc["spec"]["router"] = {"enabled": True, "policy": "round-robin"}
    return yaml.safe_dump(doc)


def pid_of(pod: dict) -> int:
    return int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))


def ready(pods: list[dict]) -> list[dict]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions", []))]


def post(url: str, key: str | None) -> tuple[int, dict[str, str]]:
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 2}).encode()
    headers = {"Content-Type": "application/json",
               **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def healthy_backends(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(r'^paged_router_backends\{state="healthy"\} (\S+)$', text, re.M)
    return int(float(found.group(1))) if found else -1


@pytest.fixture(scope="module")
def routed(local_cluster: LocalCluster) -> LocalCluster:
    local_cluster.kubectl("apply", "-f", "-", stdin=SECRET)
    local_cluster.kubectl("apply", "-f", "-", stdin=manifest())
    local_cluster.kubectl("wait", "pis/routed", "--for=condition=Ready", "--timeout=240s",
                          timeout=250)
    local_cluster.kubectl("wait", "deploy/routed-router", "--for=condition=Available",
                          "--timeout=60s", timeout=70)
    return local_cluster


def test_the_engines_check_the_api_key_from_the_secret(routed: LocalCluster) -> None:
    secret = routed.json("get", "secret", "routed-key")
    assert "stringData" not in secret and secret["data"]["token"]   # stored as data, base64
    url = routed.service_url("routed")
    assert post(url, None)[0] == 401
    assert post(url, "wrong")[0] == 401
    assert post(url, KEY)[0] == 200
    done = openai.OpenAI(base_url=url + "/v1", api_key=KEY).completions.create(
        model="tiny", prompt="Hi", max_tokens=3)
    assert done.usage.completion_tokens == 3
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="nope").completions.create(
            model="tiny", prompt="Hi", max_tokens=1)
    for pod in ready(routed.pods(ENGINES)):   # each engine checks it, not only the router
        direct = f"http://{pod['status']['podIP']}:8000"
        assert post(direct, None)[0] == 401 and post(direct, KEY)[0] == 200
        pid = pid_of(pod)
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        key_file = Path(argv[argv.index("--api-key-file") + 1])
        assert key_file.read_text() == KEY and key_file.stat().st_mode & 0o777 == 0o440
        assert KEY not in " ".join(argv) + Path(f"/proc/{pid}/environ").read_text()


def test_the_router_discovers_the_engines_and_follows_a_scale_up(routed: LocalCluster) -> None:
    url = routed.service_url("routed")
    (router,) = ready(routed.pods(ROUTERS))
    argv = Path(f"/proc/{pid_of(router)}/cmdline").read_text().split("\0")
    assert argv[argv.index("--discover") + 1] == "routed-engine"

    def routed_to(n: int) -> set[str]:
        return {post(url, KEY)[1]["x-routed-to"] for _ in range(n)}

    def engine_urls() -> set[str]:
        return {f"http://{p['status']['podIP']}:8000" for p in ready(routed.pods(ENGINES))}
    routed.wait_for(lambda: healthy_backends(url) == 2, 30, "the router to see 2 backends")
    assert routed_to(4) == engine_urls() and len(engine_urls()) == 2   # round-robin over both

    routed.kubectl("scale", "pis/routed", "--replicas=3")
    routed.wait_for(lambda: len(ready(routed.pods(ENGINES))) == 3, 180, "a third engine")
    routed.wait_for(lambda: healthy_backends(url) == 3, 30, "the router to see 3 backends")
    assert routed_to(6) == engine_urls() and len(engine_urls()) == 3


def test_a_scale_down_under_load_fails_no_request(routed: LocalCluster) -> None:
    """Two of three engine pods leave while clients keep sending through the router: each
    leaving pod turns not-ready at once (the router stops sending to it) and keeps serving
    through its preStop hook, then drains what it has in flight; no request fails."""
    import threading
    import time

    url = routed.service_url("routed")
    routed.wait_for(lambda: healthy_backends(url) == 3, 60, "the router to see 3 backends")
    results: list = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                results.append((time.monotonic(), post(url, KEY)[0]))
            except OSError as e:   # a refused or reset connection
                results.append((time.monotonic(), repr(e)))
    clients = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for thread in clients:
        thread.start()
    routed.wait_for(lambda: len(results) >= 8, 60, "requests before the scale-down")
    before = routed.pods(ENGINES)
    scaled = time.monotonic()
    routed.kubectl("scale", "pis/routed", "--replicas=1")
    routed.wait_for(lambda: len(routed.pods(ENGINES)) == 1, 120, "two engine pods to leave")
    gone = time.monotonic()
    routed.wait_for(lambda: len([t for t, _ in results if t > gone]) >= 8, 60,
                    "requests after the scale-down")
    stop.set()
    for thread in clients:
        thread.join(70)
    assert len(before) == 3 and healthy_backends(url) == 1
    during = [code for t, code in results if scaled <= t <= gone]
    assert during and gone - scaled >= 5     # the pods took their preStop hook to leave
    assert [r for r in results if r[1] != 200] == []


def test_delete_stops_the_router_and_the_engines(routed: LocalCluster) -> None:
    pids = [pid_of(p) for p in routed.pods(ENGINES) + routed.pods(ROUTERS)]
    assert len(pids) == 2   # after the scale-down: one engine, one router
    routed.kubectl("delete", "pis", "routed", "--timeout=90s", timeout=100)
    routed.wait_for(lambda: not routed.pods("app.kubernetes.io/instance=routed"), 90,
                    "the pods to go")
    assert not any(alive(p) for p in pids)
    left = routed.kubectl("get", "deploy,rs,svc,sa,role,rolebinding,endpointslices,netpol",
                          "-o", "name").stdout
    assert "routed" not in left, left
    routed.kubectl("delete", "secret", "routed-key")
