"""kubectl 1.35 (./bin/kubectl) against the local cluster's emulated API server: the verbs
users and our docs rely on, with pods run by the process kubelet (no operator here)."""
from __future__ import annotations

import json
import re
import signal
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cluster_harness import KUBECTL, ROOT, LocalCluster, alive
from localcluster.api import negotiate, protobuf

# one local cluster per module: keep the module on one xdist worker
pytestmark = pytest.mark.xdist_group("local_cluster_kubectl")


LOCAL_CLUSTER_ARGS = ["--no-operator", "--no-postgres"]

# A container with its own command runs on the host: a tiny HTTP server on the pod's address.
SERVER = ("import http.server,os,sys;print('hello from',os.environ['HOSTNAME'],flush=True);"
          "http.server.HTTPServer((sys.argv[2],8080),http.server.SimpleHTTPRequestHandler)"
          ".serve_forever()")


def deployment(env_value: str, replicas: int = 1) -> str:
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, labels: {{app: web}}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: example.org/web:1
        command: [python, -c, "{SERVER}"]
        args: [--host, 0.0.0.0]
        env: [{{name: A, value: "{env_value}"}}, {{name: B, value: "2"}}]
        ports: [{{name: http, containerPort: 8080}}]
        readinessProbe: {{httpGet: {{path: /, port: http}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: http}}]
"""


def web_pids(cluster: LocalCluster) -> list[int]:
    return [int(p["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
            for p in cluster.pods("app=web")
            if p["status"].get("containerStatuses", [{}])[0].get("containerID")]


def test_discovery_get_and_crds(local_cluster: LocalCluster) -> None:
    k = local_cluster.kubectl
    assert "No resources found" in k("get", "pods").stderr
    assert "kube-system" in k("get", "namespaces").stdout
    resources = k("api-resources").stdout
    assert "deploy" in resources and "PodMonitor" in resources
    k("apply", "-f", str(ROOT / "charts/paged-inference-operator/crds/"))   # `up` did once
    k("wait", "--for=condition=Established", "--timeout=10s",
      "crd/pagedinferenceservices.serving.pagedinference.dev")
    k("apply", "-f", str(ROOT / "examples/service.yaml"))
    row = k("get", "pis").stdout
    assert "Qwen/Qwen2.5-0.5B-Instruct" in row and "BLOCK" in row   # printer columns
    assert "Served Name:  qwen" in k("describe", "pis", "qwen").stdout
    k("delete", "pis", "qwen", "--wait=true", "--timeout=20s")


def test_get_one_object_prints_its_columns(local_cluster: LocalCluster) -> None:
    """`kubectl get KIND NAME` asks for a Table as lists do: the CRD's printer columns."""
    k = local_cluster.kubectl
    k("apply", "-f", str(ROOT / "charts/paged-inference-operator/crds/"))
    k("apply", "-f", str(ROOT / "examples/service.yaml"))
    k("apply", "-f", "-", stdin="""
apiVersion: serving.pagedinference.dev/v1alpha1
kind: PagedInferenceTuning
metadata: {name: qwen-chat}
spec: {targetRef: {name: qwen}, workload: summarize, searchSpace: {maxNumSeqs: [4, 8]}}
""")
    k("patch", "pit", "qwen-chat", "--subresource=status", "--type=merge", "-p",
      json.dumps({"status": {"trialsText": "3/4", "best": {"goodput": 6.41},
                             "workload": {"name": "summarize", "source": "workload"},
                             "gain": {"text": "1.52x [1.31, 1.76]"}, "phase": "Searching"}}))
    header, row = k("get", "pit", "qwen-chat").stdout.splitlines()
    assert header.split() == ["NAME", "TARGET", "WORKLOAD", "TRIALS", "BEST", "GOODPUT",
                              "BEST", "CAPACITY", "GAIN", "PHASE", "APPLIED", "AGE"]
    # a goodput tuning has no best capacity, and APPLIED is not set yet
    assert row.split()[:11] == ["qwen-chat", "qwen", "summarize", "3/4", "6.41", "<none>",
                                "1.52x", "[1.31,", "1.76]", "Searching", "<none>"]
    single = k("get", "pis", "qwen").stdout
    assert "BLOCK" in single and "Qwen/Qwen2.5-0.5B-Instruct" in single
    assert json.loads(k("get", "pit", "qwen-chat", "-o", "json").stdout)["kind"] == \
        "PagedInferenceTuning"   # -o json still gets the object itself
    k("delete", "pit", "qwen-chat")
    k("delete", "pis", "qwen", "--wait=true", "--timeout=20s")


def test_apply_twice_wait_scale_logs_delete(local_cluster: LocalCluster) -> None:
    cluster, k = local_cluster, local_cluster.kubectl
    watch = subprocess.Popen([str(KUBECTL), "get", "pods", "-w", "-l", "app=web"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin"})
    k("apply", "-f", "-", stdin=deployment("1"))
    k("apply", "-f", "-", stdin=deployment("3"))    # a strategic merge patch this time
    dep = cluster.json("get", "deploy", "web")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "example.org/web:1"
    assert container["env"] == [{"name": "A", "value": "3"}, {"name": "B", "value": "2"}]
    assert not any(key.startswith("$") for key in dep["spec"]["template"]["spec"])
    k("wait", "--for=condition=Available", "deploy/web", "--timeout=60s")
    k("rollout", "status", "deploy/web", "--timeout=60s")
    # the first pod (A=1) terminates within its 2 s grace period, as on a real cluster
    (pod,) = cluster.wait_for(lambda: [p for p in [cluster.pods("app=web")] if len(p) == 1]
                              and cluster.pods("app=web"), 10, "the old pod to terminate")
    assert pod["status"]["podIP"].startswith("127.0.0.")
    assert "A=3" in Path(f"/proc/{web_pids(cluster)[0]}/environ").read_text().replace("\0", " ")
    assert "hello from" in k("logs", "deploy/web").stdout
    assert "Replicas:" in k("describe", "deploy", "web").stdout

    k("scale", "deploy/web", "--replicas=2")
    k("wait", "--for=jsonpath={.status.readyReplicas}=2", "deploy/web", "--timeout=60s")
    pids = web_pids(cluster)
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert cluster.json("get", "deploy", "web", "--subresource=scale")["spec"]["replicas"] == 2
    ips = {p["status"]["podIP"] for p in cluster.pods("app=web")}
    assert len(ips) == 2                                         # one loopback address each
    slice_ = cluster.json("get", "endpointslices", "-l", "kubernetes.io/service-name=web")
    assert {e["addresses"][0] for e in slice_["items"][0]["endpoints"]} == ips

    k("delete", "deploy", "web", "--timeout=30s")
    cluster.wait_for(lambda: not cluster.pods("app=web"), 30, "the pods to go")
    assert not any(alive(p) for p in pids)
    assert k("get", "rs", "-o", "name").stdout == ""             # the ReplicaSet was collected
    time.sleep(0.5)
    watch.send_signal(signal.SIGINT)
    seen = watch.communicate(timeout=10)[0]
    assert seen.count("web-") >= 2 and "Running" in seen         # -w streamed the changes


def test_put_generate_name_selectors_and_errors(local_cluster: LocalCluster) -> None:
    cluster, k = local_cluster, local_cluster.kubectl
    # `kubectl create configmap` (a generator subcommand) sends protobuf
    k("create", "configmap", "settings", "--from-literal=a=1")
    cm = cluster.json("get", "cm", "settings")
    cm["data"]["a"] = "2"
    k("replace", "-f", "-", stdin=json.dumps(cm))                        # PUT
    assert cluster.json("get", "cm", "settings")["data"] == {"a": "2"}
    stale = k("replace", "-f", "-", stdin=json.dumps(cm), check=False)  # old resourceVersion
    assert stale.returncode != 0 and "modified" in stale.stderr
    made = k("create", "-f", "-", "-o", "name", stdin=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"generateName": "gen-", "labels": {"tier": "x"}}})).stdout
    assert made.startswith("configmap/gen-") and len(made.strip()) > len("configmap/gen-")
    assert k("get", "cm", "-l", "tier=x", "-o", "name").stdout == made
    assert k("get", "cm", "-l", "tier!=x", "-o", "name").stdout.count("gen-") == 0
    assert k("get", "cm", "--field-selector", "metadata.name=settings", "-o",
             "name").stdout.strip() == "configmap/settings"
    k("apply", "-f", "-", stdin='{"apiVersion": "v1", "kind": "Namespace", '
      '"metadata": {"name": "other"}}')
    k("-n", "other", "apply", "-f", "-", stdin='{"apiVersion": "v1", "kind": "ConfigMap", '
      '"metadata": {"name": "elsewhere"}}')
    assert "elsewhere" not in k("get", "cm", "-o", "name").stdout
    assert "other" in k("get", "cm", "-A").stdout
    missing = k("get", "cm", "nope", check=False)
    assert missing.returncode == 1 and "NotFound" in missing.stderr
    k("delete", "namespace", "other")
    assert "elsewhere" not in k("get", "cm", "-A").stdout


CRASHER = """
apiVersion: v1
kind: Pod
metadata: {name: crasher}
spec:
  containers:
  - name: logs
    image: none
    terminationMessagePolicy: FallbackToLogsOnError
    command: [python, -c, "import sys; print('model file /nope is missing'); sys.exit(3)"]
  - name: file
    image: none
    command: [python, -c, "import sys; print('not in the message'); sys.exit(4)"]
"""


# Writes when SIGTERM came (the preStop hook must have ended by then) and exits.
TERM_WRITER = ("import signal,sys,time;"
               "signal.signal(signal.SIGTERM,lambda *a:(open(sys.argv[1],'w')"
               ".write(repr(time.time())),sys.exit(0)));print('up',flush=True);"
               "[time.sleep(0.05) for _ in iter(int,1)]")
HOOK = ("import os,sys,time;time.sleep(float(os.environ['HOOK_DELAY']));"
        "open(sys.argv[1],'w').write(repr(time.time()))")


def test_delete_runs_the_prestop_hook_before_sigterm(local_cluster: LocalCluster,
                                                      tmp_path: Path) -> None:
    """A pod's preStop hook runs, in its container's environment, before SIGTERM (what
    lets a router stop sending to an engine before it stops accepting), and its time
    counts against the grace period."""
    cluster = local_cluster

    def delete(name: str, grace: int, hook_delay: float) -> float:
        cluster.kubectl("apply", "-f", "-", stdin=f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  terminationGracePeriodSeconds: {grace}
  containers:
  - name: c
    image: none
    command: [python, -c, "{TERM_WRITER}", "{tmp_path / name}.term"]
    env: [{{name: HOOK_DELAY, value: "{hook_delay}"}}]
    lifecycle:
      preStop:
        exec: {{command: [python, -c, "{HOOK}", "{tmp_path / name}.hook"]}}
""")
        cluster.wait_for(lambda: "up" in cluster.kubectl("logs", name).stdout, 30,
                         "the container to start")
        asked = time.time()
        cluster.kubectl("delete", "pod", name, "--wait=false")
        cluster.wait_for(lambda: not cluster.pods(f"app={name}"), 40, "the pod to go")
        return asked

    asked = delete("drainer", 20, 1.5)
    hook_done = float((tmp_path / "drainer.hook").read_text())
    termed = float((tmp_path / "drainer.term").read_text())
    assert asked + 1.5 <= hook_done <= termed < asked + 20
    # a hook longer than the grace period is cut short: SIGTERM at the period's end
    asked = delete("hasty", 2, 30)
    assert not (tmp_path / "hasty.hook").exists()
    assert asked + 2 <= float((tmp_path / "hasty.term").read_text()) < asked + 6


def test_exits_restart_with_last_state_and_the_log_tail(local_cluster: LocalCluster) -> None:
    """What the operator reads to report an engine failing: lastState.terminated with the
    exit code, and the log tail as its message only under FallbackToLogsOnError."""
    cluster = local_cluster
    cluster.kubectl("apply", "-f", "-", stdin=CRASHER)

    def restarted() -> dict | None:
        st = cluster.json("get", "pod", "crasher")["status"].get("containerStatuses") or []
        done = {c["name"]: c for c in st if c.get("lastState", {}).get("terminated")}
        return done if len(done) == 2 else None
    statuses = cluster.wait_for(restarted, 30, "both containers to exit and restart")
    logs, file = (statuses[n]["lastState"]["terminated"] for n in ("logs", "file"))
    assert (logs["exitCode"], logs["reason"]) == (3, "Error")
    assert "model file /nope is missing" in logs["message"]
    assert file["exitCode"] == 4 and "message" not in file   # policy File: no log fallback
    assert all(s["restartCount"] >= 1 for s in statuses.values())
    cluster.wait_for(lambda: "/nope is missing" in cluster.kubectl(
        "logs", "crasher", "-c", "logs", "--previous", check=False).stdout, 15,
        "the previous run's log")
    cluster.kubectl("delete", "pod", "crasher", "--timeout=30s")


# ---- answers in protobuf: what kubectl's typed clients and Helm ask for ----

def _answers(cluster: LocalCluster) -> dict[str, int]:
    """The server's own count of its answers by content type (its /metrics)."""
    with urllib.request.urlopen(cluster.info["api"] + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {m[0]: int(m[1]) for m in re.findall(r'content_type="([^"]+)"} (\d+)', text)}


def _protobuf_answers(cluster: LocalCluster) -> int:
    return _answers(cluster).get(protobuf.CONTENT_TYPE, 0)


def _get(cluster: LocalCluster, path: str, accept: str) -> tuple[int, str, bytes]:
    request = urllib.request.Request(cluster.info["api"] + path, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def _pruned(value: Any) -> Any:
    """Without the zero values Go's JSON leaves out (the decoder leaves them out too)."""
    if isinstance(value, dict):
        value = {k: _pruned(v) for k, v in value.items() if k not in ("apiVersion", "kind")}
        return {k: v for k, v in value.items() if v not in (None, "", 0, False, {}, [])}
    return [_pruned(v) for v in value] if isinstance(value, list) else value


# embedded Go structs (a Volume's source, a Probe's handler, LocalObjectReference): their
# fields are the parent's in JSON
EMBEDDED = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "pb-e"},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "pb-e"}},
                     "template": {"metadata": {"labels": {"app": "pb-e"}}, "spec": {
                         "volumes": [{"name": "v", "configMap": {"name": "pb-cm"}}],
                         "containers": [{
                             "name": "c", "image": "example.org/idle:1",
                             "envFrom": [{"configMapRef": {"name": "pb-cm"}}],
                             "env": [{"name": "K", "valueFrom": {"secretKeyRef": {
                                 "name": "pb-s", "key": "key"}}}],
                             "readinessProbe": {"httpGet": {"path": "/", "port": 8080}},
                             "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}}}}
LISTS = ["/api/v1/namespaces", "/api/v1/configmaps", "/api/v1/secrets", "/api/v1/services",
         "/api/v1/pods", "/api/v1/serviceaccounts", "/apis/apps/v1/deployments",
         "/apis/apps/v1/replicasets", "/apis/rbac.authorization.k8s.io/v1/roles",
         "/apis/rbac.authorization.k8s.io/v1/rolebindings",
         "/apis/discovery.k8s.io/v1/endpointslices",
         "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"]


def test_kubectl_and_helm_work_with_protobuf_answers(local_cluster: LocalCluster) -> None:
    """kubectl's generators, describe and logs use typed clients, and Helm its release
    Secrets, all asking `application/vnd.kubernetes.protobuf,application/json`: the server
    answers them in protobuf (counted on its side) and they work as against JSON."""
    cluster, k = local_cluster, local_cluster.kubectl
    before = _protobuf_answers(cluster)
    k("create", "namespace", "pb")
    k("-n", "pb", "create", "configmap", "pb-cm", "--from-literal=a=1")
    k("-n", "pb", "create", "secret", "generic", "pb-s", "--from-literal=key=v")
    k("-n", "pb", "create", "deployment", "pb-d", "--image=example.org/idle:1", "--replicas=0")
    assert _protobuf_answers(cluster) - before >= 4           # the four created objects
    again = k("-n", "pb", "create", "configmap", "pb-cm", check=False)   # a Status in protobuf
    assert again.returncode == 1 and '"pb-cm" already exists' in again.stderr
    assert cluster.json("-n", "pb", "get", "cm", "pb-cm")["data"] == {"a": "1"}
    assert cluster.json("-n", "pb", "get", "secret", "pb-s")["data"] == {"key": "dg=="}
    k("-n", "pb", "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pb-cm"},
        "data": {"a": "2"}}))
    assert cluster.json("-n", "pb", "get", "cm", "pb-cm")["data"] == {"a": "2"}
    described = _protobuf_answers(cluster)
    assert "Replicas:" in k("-n", "pb", "describe", "deployment", "pb-d").stdout
    assert _protobuf_answers(cluster) > described             # the Deployment, its lists

    chart = str(ROOT / "charts" / "paged-inference-operator")
    idle = ["--set", "image.repository=example.org/idle"]
    helm_from = _protobuf_answers(cluster)
    cluster.helm("install", "pio", chart, "-n", "pb-helm", "--create-namespace", *idle)
    cluster.helm("upgrade", "pio", chart, "-n", "pb-helm", "--server-side=false", *idle,
                 "--set", "resyncSeconds=7")
    [release] = json.loads(cluster.helm("list", "-n", "pb-helm", "-o", "json").stdout)
    assert (release["status"], release["revision"]) == ("deployed", "2")
    assert _protobuf_answers(cluster) - helm_from >= 6        # release Secrets read, written
    k("-n", "pb", "apply", "-f", "-", stdin=json.dumps(EMBEDDED))
    compared = {}
    for path in LISTS:   # every stored object reads the same in protobuf as in JSON
        for _ in range(20):   # a controller may write between the reads: read until still
            before = json.loads(_get(cluster, path, "application/json")[2])["items"]
            code, type_, body = _get(cluster, path, f"{protobuf.CONTENT_TYPE},application/json")
            items = json.loads(_get(cluster, path, "application/json")[2])["items"]
            if items == before:
                break
        assert (code, type_) == (200, protobuf.CONTENT_TYPE), path
        assert _pruned(protobuf.decode(body).get("items", [])) == _pruned(items), path
        compared[path.rsplit("/", 1)[1]] = len(items)
    assert min(n for kind, n in compared.items() if kind not in ("services", "pods",
                                                                 "endpointslices")) > 0
    cluster.helm("uninstall", "pio", "-n", "pb-helm", "--wait")
    assert cluster.json("get", "deploy,sa,secrets", "-n", "pb-helm")["items"] == []

    # the same object either way; custom resources only in JSON; a watch in frames
    pb = f"{protobuf.CONTENT_TYPE},application/json"
    code, type_, body = _get(cluster, "/api/v1/namespaces/pb/configmaps/pb-cm", pb)
    assert (code, type_) == (200, protobuf.CONTENT_TYPE)
    as_json = cluster.json("-n", "pb", "get", "cm", "pb-cm")
    assert protobuf.decode(body)["data"] == as_json["data"]
    assert protobuf.decode(body)["metadata"]["uid"] == as_json["metadata"]["uid"]
    code, type_, body = _get(cluster, "/api/v1/namespaces/pb/configmaps/nope", pb)
    assert code == 404 and protobuf.decode(body)["reason"] == "NotFound"
    k("apply", "-f", str(ROOT / "charts/paged-inference-operator/crds/"))
    crs = "/apis/serving.pagedinference.dev/v1alpha1/pagedinferenceservices"
    assert _get(cluster, crs, pb)[:2] == (200, "application/json; charset=utf-8")
    assert _get(cluster, crs, protobuf.CONTENT_TYPE)[0] == 406
    code, type_, body = _get(cluster, "/api/v1/namespaces/pb/configmaps?watch=true"
                             "&timeoutSeconds=1", pb)
    assert type_ == protobuf.CONTENT_TYPE + ";stream=watch"
    (size,) = struct.unpack(">I", body[:4])
    event = protobuf._fields(body[4:4 + size])   # WatchEvent: type, object (RawExtension)
    assert event[1] == [b"ADDED"]
    assert protobuf.decode(protobuf._fields(event[2][0])[1][0])["metadata"]["name"] == "pb-cm"
    # kubectl events -w: a typed watch in protobuf frames, decoded by kubectl itself
    out, watches = cluster.dir / "events-w.out", _answers(cluster)[negotiate.WATCH_PROTOBUF]
    with open(out, "w") as sink:
        watch = subprocess.Popen([str(KUBECTL), "-n", "pb", "events", "-w"], stdout=sink,
                                 stderr=subprocess.STDOUT,
                                 env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin"})
    try:
        cluster.wait_for(lambda: _answers(cluster)[negotiate.WATCH_PROTOBUF] > watches, 20,
                         "kubectl events -w to watch")
        k("-n", "pb", "create", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": "pb-e.1"},
            "involvedObject": {"kind": "Deployment", "name": "pb-e", "namespace": "pb"},
            "reason": "Watched", "message": "framed in protobuf", "type": "Normal",
            "count": 1, "lastTimestamp": "2026-01-02T03:04:05Z"}))
        cluster.wait_for(lambda: "framed in protobuf" in out.read_text(), 20,
                         "the event through kubectl's protobuf watch")
    finally:
        watch.terminate()
        watch.wait(timeout=10)
    k("delete", "namespace", "pb")
