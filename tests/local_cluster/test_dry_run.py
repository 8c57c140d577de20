"""kubectl 1.35's `--dry-run=server` (`dryRun=All`) against the local cluster's API server:
the write is admitted as a real one is (defaults, schema, CEL rules; 422 for an invalid
object) and answered, but nothing is stored and no resourceVersion is used."""
from __future__ import annotations

import json

import pytest
import yaml

from cluster_harness import ROOT, LocalCluster

pytestmark = pytest.mark.xdist_group("local_cluster_dry_run")

LOCAL_CLUSTER_ARGS = ["--no-operator", "--no-postgres"]   # nothing reacts to what is written
EXAMPLE = ROOT / "examples" / "service-cpu.yaml"


def list_version(c: LocalCluster) -> str:
    """The store's latest resourceVersion, as a LIST answers it."""
    raw = c.kubectl("get", "--raw", "/api/v1/namespaces/default/configmaps").stdout
    return json.loads(raw)["metadata"]["resourceVersion"]


def test_server_dry_run_admits_answers_and_stores_nothing(local_cluster: LocalCluster) -> None:
    c = local_cluster
    before = list_version(c)
    done = c.kubectl("apply", "--dry-run=server", "-f", str(EXAMPLE), "-o", "json")
    answered = json.loads(done.stdout)
    # admitted: the CRD's defaults are filled in the answer, as they would be stored
    assert answered["spec"]["engine"]["enablePrefixCaching"] is True
    assert answered["spec"]["engine"]["gpuMemoryUtilization"] == 0.9
    assert c.kubectl("get", "pis", "tiny", check=False).returncode != 0   # not stored
    # an invalid object is refused with the CRD's message, as a real write would be
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["spec"]["engine"]["blockSize"] = 48
    refused = c.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(bad),
                        check=False)
    assert refused.returncode != 0 and "is invalid" in refused.stderr
    assert "spec.engine.blockSize" in refused.stderr
    # a built-in kind through kubectl's generator (a protobuf body)
    created = c.kubectl("create", "configmap", "dry", "--from-literal=a=b",
                        "--dry-run=server")
    assert "(server dry run)" in created.stdout
    assert c.kubectl("get", "configmap", "dry", check=False).returncode != 0
    assert list_version(c) == before   # no write took a resourceVersion


def test_server_dry_run_patch_and_delete_leave_the_object(local_cluster: LocalCluster) -> None:
    c = local_cluster
    c.kubectl("apply", "-f", str(EXAMPLE))
    stored = c.json("get", "pis", "tiny")
    patched = json.loads(c.kubectl("patch", "pis", "tiny", "--type=merge", "--dry-run=server",
                                   "-p", '{"spec": {"replicas": 3}}', "-o", "json").stdout)
    assert patched["spec"]["replicas"] == 3
    assert patched["metadata"]["generation"] == stored["metadata"]["generation"] + 1
    # a patch that breaks a rule is refused under a dry run too
    refused = c.kubectl("patch", "pis", "tiny", "--type=merge", "--dry-run=server", "-p",
                        '{"spec": {"engine": {"gpuMemoryUtilization": 1.5}}}', check=False)
    assert refused.returncode != 0 and "spec.engine.gpuMemoryUtilization" in refused.stderr
    deleted = c.kubectl("delete", "pis", "tiny", "--dry-run=server")
    assert "(server dry run)" in deleted.stdout
    after = c.json("get", "pis", "tiny")
    assert after == stored   # same spec, same resourceVersion: nothing was written
    c.kubectl("delete", "pis", "tiny")
