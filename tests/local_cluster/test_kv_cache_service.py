"""spec.kvCache on the local cluster, with the stand-in engine (tests/local_cluster/
fake_engine_pkg, which ignores the KV tiers' flags): kubectl refuses invalid tiers at
admission naming the field; a host tier and an emptyDir disk tier render (flags, volume,
mount, memory) and reconcile to a Ready service whose engine process runs with the tiers'
flags, its disk directory a folder the kubelet made for the pod's emptyDir."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_harness import LocalCluster
from tuning_harness import service

pytestmark = pytest.mark.xdist_group("local_cluster_kv_cache")

LOCAL_CLUSTER_ARGS = ["--no-postgres"]
NAME = "tiers"
ENGINES = f"app.kubernetes.io/name=paged-inference-engine,app.kubernetes.io/instance={NAME}"


def manifest(kv_cache: dict, **engine) -> str:
    body = service(NAME)
    body["spec"]["kvCache"] = kv_cache
    body["spec"]["engine"] |= engine
    return json.dumps(body)


def running_args(cluster: LocalCluster) -> list[list[str]]:
    """argv of each ready engine process (what the kubelet started)."""
    out = []
    for pod in cluster.pods(ENGINES):
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if pod["metadata"].get("deletionTimestamp") or not statuses \
                or not statuses[0].get("ready"):
            continue
        pid = int(statuses[0]["containerID"].removeprefix("local://"))
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_text().split("\0"))
        except OSError:
            continue
    return out


@pytest.mark.parametrize("kv_cache, engine, field", [
    ({"disk": {"sizeGiB": 1, "volume": {}}}, {}, "spec.kvCache.disk.volume"),
    ({"disk": {"sizeGiB": 0, "volume": {"emptyDir": {}}}}, {}, "spec.kvCache.disk.sizeGiB"),
    ({"disk": {"volume": {"emptyDir": {}}}}, {}, "spec.kvCache.disk.sizeGiB"),
    ({"offloadGiB": 1}, {"enablePrefixCaching": False}, "kvCache needs engine.enablePrefix"),
])
def test_invalid_tiers_are_refused_at_admission(local_cluster: LocalCluster, kv_cache, engine,
                                               field) -> None:
    done = local_cluster.kubectl("apply", "-f", "-", stdin=manifest(kv_cache, **engine),
                                 check=False)
    assert done.returncode != 0 and field in done.stderr, done.stderr
    assert local_cluster.kubectl("get", "pis", NAME, check=False).returncode != 0


def test_host_and_empty_dir_disk_tiers_reconcile(local_cluster: LocalCluster) -> None:
    c = local_cluster
    c.kubectl("apply", "-f", "-", stdin=manifest(
        {"offloadGiB": 0.25, "disk": {"sizeGiB": 1, "volume": {"emptyDir": {}}}}))
    c.kubectl("wait", f"pis/{NAME}", "--for=condition=Ready", "--timeout=180s", timeout=200)
    pod = json.loads(c.kubectl("get", "deployment", NAME, "-o", "json").stdout)[
        "spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {"name": "kv-cache", "emptyDir": {"sizeLimit": "1280Mi"}} in pod["volumes"]
    assert {"name": "kv-cache", "mountPath": "/kv-cache"} in container["volumeMounts"]
    assert container["resources"]["requests"]["memory"] == \
        container["resources"]["limits"]["memory"] == "1280Mi"   # 1Gi + the host tier
    (argv,) = c.wait_for(lambda: running_args(c) or None, 60, "a ready engine process")
    assert argv[argv.index("--kv-offloading-size") + 1] == "0.25"
    assert argv[argv.index("--kv-disk-size") + 1] == "1.0"
    disk_dir = Path(argv[argv.index("--kv-disk-dir") + 1])
    assert disk_dir != Path("/kv-cache") and disk_dir.is_dir()   # the pod's emptyDir folder
    c.kubectl("delete", "pis", NAME, "--timeout=90s", timeout=100)
    c.wait_for(lambda: not c.pods(f"app.kubernetes.io/instance={NAME}"), 90, "the pods to go")
