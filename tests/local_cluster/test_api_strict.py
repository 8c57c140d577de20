"""The local API server is as strict as a real one, through real kubectl and helm: custom
resources are pruned, defaulted and validated against their CRD's schema and CEL rules
(transition rules too), in kube-apiserver's words; protobuf bodies (kubectl's generators,
Helm) are accepted; the chart installs, upgrades and uninstalls, and its two operator
replicas peer so that killing the active one mid-reconcile hands over without duplicates.
One cluster for the module, without `up`'s own operator."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from typing import Any

import pytest
import yaml

from breaking_objects import BREAKING, pis, pit
from cluster_harness import ROOT, LocalCluster

pytestmark = pytest.mark.xdist_group("local_cluster_strict")

LOCAL_CLUSTER_ARGS = ["--no-operator", "--no-postgres"]
CRDS = ROOT / "charts" / "paged-inference-operator" / "crds"


def cel_messages() -> set[str]:
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        found.update(r["message"] for r in node.get("x-kubernetes-validations") or [])
        for child in (node.get("properties") or {}).values():
            walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
    for path in CRDS.glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            for version in crd["spec"]["versions"]:
                walk(version["schema"]["openAPIV3Schema"])
    return found


def apply(cluster: LocalCluster, obj: Any, *args: str, check: bool = False):
    return cluster.kubectl("apply", "-f", "-", *args, stdin=json.dumps(obj), check=check)


def test_every_cel_rule_of_the_charts_crds_refuses_an_object(local_cluster: LocalCluster):
    refused: set[str] = set()
    for obj in BREAKING:
        done = apply(local_cluster, obj)
        kind, name = obj["kind"], obj["metadata"]["name"]
        assert done.returncode == 1, f"{kind} {name} was accepted: {done.stdout}"
        # kubectl's wording for a 422 with details: the kind, the name, then field: cause
        assert done.stderr.startswith(f'The {kind} "{name}" is invalid: '), done.stderr
        refused |= {m for m in cel_messages() if m in done.stderr}
        assert re.search(r': Invalid value: "(object|string|array)": ', done.stderr)
    assert refused == cel_messages()
    assert not local_cluster.json("get", "pis,pit")["items"], "a refused object was stored"


def test_root_rule_reports_no_field_and_nested_rule_its_path(local_cluster: LocalCluster):
    root = apply(local_cluster, pis("y" * 53)).stderr
    assert '<nil>: Invalid value: "object": metadata.name must be at most 52' in root
    nested = apply(local_cluster, pis(autoscaling={"minReplicas": 3, "maxReplicas": 2}))
    assert 'spec.autoscaling: Invalid value: "object": minReplicas must be <=' in nested.stderr


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in
                                        (ROOT / "examples").rglob("*.yaml")))
def test_every_example_manifest_is_admitted(local_cluster: LocalCluster, path: str):
    local_cluster.kubectl("apply", "-f", str(ROOT / path))
    local_cluster.kubectl("delete", "-f", str(ROOT / path), "--wait=false")


def test_schema_violations_name_the_field_and_the_bound(local_cluster: LocalCluster):
    cases = [
        (pit(trials=0), "spec.trials: Invalid value: 0: spec.trials in body should be "
                        "greater than or equal to 1"),
        (pit(trials="many"), 'spec.trials: Invalid value: "string": spec.trials in body '
                             'must be of type integer: "string"'),
        (pit(workload="poems"), 'spec.workload: Unsupported value: "poems": supported values: '
                                '"chat", "summarize", "code", "rag", "mixed", "agentic"'),
        (pit(prometheus={"url": "ftp://p"}), 'spec.prometheus.url: Invalid value: "ftp://p": '
                                             "spec.prometheus.url in body should match "
                                             "'^https?://'"),
        (pit(rate=0), "spec.rate: Invalid value: 0: spec.rate in body should be greater "
                      "than 0"),
        ({**pit(), "spec": {}}, "spec.targetRef: Required value"),
        (pit(targetRef={"name": "n" * 53}), "spec.targetRef.name: Too long: may not be more "
                                            "than 52 bytes"),
        (pis(replicas=-1), "spec.replicas: Invalid value: -1: spec.replicas in body should "
                           "be greater than or equal to 0"),
    ]
    for obj, expected in cases:
        done = apply(local_cluster, obj)
        assert done.returncode == 1 and expected in done.stderr, (expected, done.stderr)


def test_defaults_are_stored_and_unknown_fields_pruned_or_refused(local_cluster: LocalCluster):
    k = local_cluster.kubectl
    strict = apply(local_cluster, pit("pruned", bogus=1))   # kubectl's --validate=strict
    assert strict.returncode == 1
    assert ('Error from server (BadRequest): error when creating "STDIN": PagedInferenceTuning '
            'in version "v1alpha1" cannot be handled as a PagedInferenceTuning: strict decoding '
            'error: unknown field "spec.bogus"') in strict.stderr
    warned = apply(local_cluster, pit("pruned", bogus=1, confirm={"extra": 2}),
                   "--validate=warn", check=True)
    assert 'unknown field "spec.bogus"' in warned.stderr
    assert 'unknown field "spec.confirm.extra"' in warned.stderr
    spec = local_cluster.json("get", "pit", "pruned")["spec"]
    assert "bogus" not in spec
    assert spec["confirm"] == {"rounds": 3, "candidates": 1}   # defaults inside a given object
    assert spec["trials"] == 24 and spec["trialDuration"] == "120s" and spec["suspend"] is False
    assert "workload" not in spec and "capacity" not in spec   # no default, not made up
    # a merge patch is admitted too: defaults stay, a bad value is refused, null resets
    k("patch", "pit", "pruned", "--type=merge", "-p", '{"spec": {"trials": null}}')
    assert local_cluster.json("get", "pit", "pruned")["spec"]["trials"] == 24
    bad = k("patch", "pit", "pruned", "--type=merge", "-p", '{"spec": {"trials": 1001}}',
            check=False)
    assert "spec.trials in body should be less than or equal to 1000" in bad.stderr
    k("delete", "pit", "pruned")


WIDGETS = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.example"},
    "spec": {"group": "test.example", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "properties": {
                                   "size": {"type": "integer", "x-kubernetes-validations": [
                                       {"rule": "self == oldSelf",
                                        "message": "size is immutable"}]},
                                   "level": {"type": "integer", "default": 1,
                                             "x-kubernetes-validations": [
                                                 {"rule": "self >= oldSelf",
                                                  "message": "level may only grow"}]}}},
                               "status": {"type": "object", "properties": {
                                   "ready": {"type": "boolean"}}}}}}}]}}


def test_transition_rules_see_the_stored_object(local_cluster: LocalCluster):
    k = local_cluster.kubectl
    apply(local_cluster, WIDGETS, check=True)
    k("wait", "--for=condition=Established", "crd/widgets.test.example", "--timeout=10s")
    widget = {"apiVersion": "test.example/v1", "kind": "Widget", "metadata": {"name": "w"},
              "spec": {"size": 3}}
    apply(local_cluster, widget, check=True)   # create: oldSelf rules do not run
    assert local_cluster.json("get", "widget", "w")["spec"] == {"size": 3, "level": 1}
    changed = k("patch", "widget", "w", "--type=merge", "-p", '{"spec": {"size": 4}}',
                check=False)
    assert changed.returncode == 1
    assert ('The Widget "w" is invalid: spec.size: Invalid value: "integer": size is '
            "immutable") in changed.stderr
    k("patch", "widget", "w", "--type=merge", "-p", '{"spec": {"level": 5}}')
    lower = k("patch", "widget", "w", "--type=merge", "-p", '{"spec": {"level": 2}}',
              check=False)
    assert "level may only grow" in lower.stderr
    # the status subresource is validated against the schema as well
    status = k("patch", "widget", "w", "--subresource=status", "--type=merge", "-p",
               '{"status": {"ready": "yes"}}', check=False)
    assert "status.ready in body must be of type boolean" in status.stderr
    assert local_cluster.json("get", "widget", "w")["spec"] == {"size": 3, "level": 5}


def test_a_crd_whose_rule_does_not_compile_is_refused(local_cluster: LocalCluster):
    crd = json.loads(json.dumps(WIDGETS))
    crd["metadata"]["name"] = "gadgets.test.example"
    crd["spec"]["names"] = {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"}
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["x-kubernetes-validations"] = [{"rule": "self.size >", "message": "m"}]
    done = apply(local_cluster, crd)
    assert done.returncode == 1 and "compilation failed" in done.stderr, done.stderr


def test_ratcheting_keeps_objects_of_an_older_schema_writable(local_cluster: LocalCluster):
    """An object stored before a rule existed can still get its status written (the
    operator's patches); changing the offending field itself is checked."""
    k = local_cluster.kubectl
    apply(local_cluster, {"apiVersion": "test.example/v1", "kind": "Widget",
                          "metadata": {"name": "old"}, "spec": {"size": 1, "level": 9}},
          check=True)
    crd = json.loads(json.dumps(WIDGETS))
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props["properties"]["level"]["maximum"] = 5
    apply(local_cluster, crd, check=True)
    k("patch", "widget", "old", "--subresource=status", "--type=merge", "-p",
      '{"status": {"ready": true}}')
    k("patch", "widget", "old", "--type=merge", "-p", '{"metadata": {"labels": {"a": "b"}}}')
    raised = k("patch", "widget", "old", "--type=merge", "-p", '{"spec": {"level": 10}}',
               check=False)
    assert "spec.level in body should be less than or equal to 5" in raised.stderr


# ---- protobuf bodies: kubectl's generators and Helm (bin/helm, Helm 4) ----

def test_kubectl_create_generators_are_stored_as_their_manifests(local_cluster: LocalCluster):
    """`kubectl create configmap|secret|namespace|deployment` send protobuf: the stored
    objects read as the same manifests sent as YAML would (--dry-run=client -o json)."""
    k = local_cluster.kubectl
    commands = [
        ["configmap", "c1", "--from-literal=a=1", "--from-literal=empty="],
        ["secret", "generic", "s1", "--from-literal=key=v", "--type=example.org/x"],
        ["namespace", "made-by-create"],
        ["deployment", "d0", "--image=example.org/idle:1", "--replicas=0", "--port=8080"],
    ]
    for args in commands:
        local = json.loads(k("create", *args, "--dry-run=client", "-o", "json").stdout)
        k("create", *args)
        stored = local_cluster.json("get", local["kind"].lower(), local["metadata"]["name"])
        for key in ("data", "type", "labels"):
            if key in local:
                assert stored[key] == local[key], (args, key)
        if "labels" in local["metadata"]:
            assert stored["metadata"]["labels"] == local["metadata"]["labels"]
        if local["kind"] == "Deployment":
            spec = stored["spec"]
            assert spec["replicas"] == 0   # a pointer's zero is kept
            assert spec["selector"] == local["spec"]["selector"]
            container = spec["template"]["spec"]["containers"][0]
            assert [p["containerPort"] for p in container["ports"]] == [8080]
            assert spec["strategy"]["type"] == "RollingUpdate"   # `strategy: {}` defaulted
    assert local_cluster.json("get", "secret", "s1")["data"] == {"key": "dg=="}
    assert local_cluster.json("get", "configmap", "c1")["data"] == {"a": "1", "empty": ""}
    k("delete", "deployment", "d0")


def helm(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return cluster.helm(*args, check=check)


CHART = str(ROOT / "charts" / "paged-inference-operator")
# the operator's pod stays Waiting (an image the process kubelet does not run): this module
# checks what Helm writes, not the operator
IDLE = ["--set", "image.repository=example.org/idle"]


@pytest.mark.parametrize("apply_mode", ["--server-side=true", "--server-side=false"])
def test_helm_install_upgrade_uninstall(local_cluster: LocalCluster, apply_mode: str):
    ns = "inference-" + apply_mode.rsplit("=", 1)[1]
    helm(local_cluster, "install", "pio", CHART, "-n", ns, "--create-namespace", apply_mode,
         *IDLE)
    [release] = json.loads(helm(local_cluster, "list", "-n", ns, "-o", "json").stdout)
    assert (release["status"], release["revision"]) == ("deployed", "1")
    objs = local_cluster.json("get", "deploy,sa,role,rolebinding", "-n", ns)["items"]
    assert sorted(o["kind"] for o in objs) == ["Deployment", "Role", "RoleBinding",
                                               "ServiceAccount"]
    helm(local_cluster, "upgrade", "pio", CHART, "-n", ns, apply_mode, *IDLE,
         "--set", "resyncSeconds=7")
    [release] = json.loads(helm(local_cluster, "list", "-n", ns, "-o", "json").stdout)
    assert (release["status"], release["revision"]) == ("deployed", "2")
    env = local_cluster.json("get", "deploy", "-n", ns)["items"][0]["spec"]["template"][
        "spec"]["containers"][0]["env"]
    assert {"name": "PAGED_OPERATOR_RESYNC_SECONDS", "value": "7"} in env
    secrets = local_cluster.json("get", "secrets", "-n", ns, "-l", "owner=helm")["items"]
    assert sorted(s["metadata"]["labels"]["status"] for s in secrets) == ["deployed",
                                                                          "superseded"]
    helm(local_cluster, "uninstall", "pio", "-n", ns, "--wait")
    local_cluster.wait_for(lambda: not local_cluster.json(
        "get", "deploy,rs,pods,sa,role,rolebinding,secrets,configmaps", "-n", ns)["items"],
        30, f"helm uninstall to empty {ns}")
    crds = {c["metadata"]["name"] for c in local_cluster.json("get", "crds")["items"]}
    assert {"pagedinferenceservices.serving.pagedinference.dev",
            "pagedinferencetunings.serving.pagedinference.dev"} <= crds   # Helm keeps CRDs


# ---- operator HA: two replicas from the chart, kopf peering ----

HA_NS, SERVICES = "ha", 20


def _operator_pods(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.json(
        "get", "pods", "-n", HA_NS, "-l", "app.kubernetes.io/name=paged-inference-operator")[
        "items"]}


def _log(cluster: LocalCluster, pod: str) -> str:
    path = cluster.dir / "pods" / HA_NS / pod / "logs" / "operator.log"
    return path.read_text() if path.exists() else ""


def _peers(cluster: LocalCluster) -> dict[str, Any]:
    peering = cluster.json("get", "kopfpeerings", "-n", HA_NS)["items"]
    return (peering[0].get("status") or {}) if peering else {}


def _service(i: int) -> dict[str, Any]:
    obj = pis(f"s{i:02d}", image="example.org/idle:1",   # pods stay Waiting: no processes
              resources={"gpus": 0, "cpu": "1", "memory": "1Gi"})
    obj["metadata"]["namespace"] = HA_NS
    return obj


def test_killing_the_active_operator_hands_over_without_duplicates(local_cluster):
    cluster = local_cluster
    helm(cluster, "install", "ha", CHART, "-n", HA_NS, "--create-namespace")
    # two replicas, both recorded in the peering object (kopf pauses the lower priority)
    cluster.wait_for(lambda: len(_peers(cluster)) == 2, 120, "two peered operator replicas")
    peers = _peers(cluster)
    active = max(peers, key=lambda p: peers[p]["priority"])   # the earliest started
    [standby] = [p for p in peers if p != active]
    # its process known before the services exist: nothing but the kill between the first
    # Deployment and it (CI 2026-12-05: the pod lookup there let all 20 finish first)
    pid = int(_operator_pods(cluster)[active]["status"]["containerStatuses"][0][
        "containerID"].removeprefix("local://"))

    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [_service(i) for i in range(SERVICES)]}))

    # The kill must come while the active replica is at work: a new service costs it about
    # 11 requests, so all 20 were done before kubectl had counted three Deployments. Ask
    # the API itself, and kill at the first one.
    def deployments() -> int:
        url = (f"{cluster.info['api']}/apis/apps/v1/namespaces/{HA_NS}/deployments"
               "?labelSelector=app.kubernetes.io%2Fname%3Dpaged-inference-engine")
        with urllib.request.urlopen(url, timeout=10) as response:
            return len(json.load(response)["items"])
    deadline = time.monotonic() + 90
    while deployments() < 1:   # the active operator at work
        assert time.monotonic() < deadline, "no Deployment from the active operator in 90 s"
    os.kill(pid, signal.SIGKILL)   # mid-reconcile: no chance to leave the peering
    # the paused one wrote nothing (it resumes only once the active's record lapses, 15 s)
    assert "Handler '" not in _log(cluster, standby)
    done_at_kill = sum(1 for s in cluster.json("get", "pis", "-n", HA_NS)["items"]
                       if (s.get("status") or {}).get("observedGeneration"))
    assert done_at_kill < SERVICES, "the operator finished before it was killed"

    def took_over() -> bool:   # kopf logs the resume; or the handlers' own lines
        log = _log(cluster, standby)
        return "Resuming operations" in log.split("Pausing operations")[-1] or "Handler '" in log
    cluster.wait_for(took_over, 60, "the standby to take over (the record lives 15 s)")

    def settled() -> list[dict[str, Any]] | None:
        items = cluster.json("get", "pis", "-n", HA_NS)["items"]
        ok = [s for s in items if (s.get("status") or {}).get("observedGeneration") == 1
              and {c["type"]: c["reason"] for c in s["status"].get("conditions", [])}.get(
                  "Ready") == "ReplicasNotReady"]
        return items if len(ok) == SERVICES else None
    services = cluster.wait_for(settled, 150, "every service's status from the new active")

    # one set of children each: one Deployment per service, never rolled (one ReplicaSet)
    owners = {s["metadata"]["uid"]: s["metadata"]["name"] for s in services}
    children: dict[str, list[str]] = {name: [] for name in owners.values()}
    for child in cluster.json("get", "deploy,svc,sa", "-n", HA_NS)["items"]:
        for ref in child["metadata"].get("ownerReferences") or []:
            if ref["uid"] in owners:
                children[owners[ref["uid"]]].append(child["kind"])
    kinds = {name: sorted(k) for name, k in children.items()}
    assert all(k == kinds["s00"] for k in kinds.values()), kinds
    assert kinds["s00"].count("Deployment") == 1
    replicasets = cluster.json("get", "rs", "-n", HA_NS, "-l",
                               "app.kubernetes.io/name=paged-inference-engine")["items"]
    assert len(replicasets) == SERVICES
    # the killed replica came back (restartPolicy Always) with a lower priority: it waits
    def recorded_again() -> bool:   # absent between its old record's expiry and the new one
        peers = _peers(cluster)   # (either record may lapse for a moment on a busy machine)
        return active in peers and standby in peers and \
            peers[active]["priority"] < peers[standby]["priority"]
    cluster.wait_for(recorded_again, 60, "the restarted replica to record itself")
    helm(cluster, "uninstall", "ha", "-n", HA_NS)
