"""One local cluster (scripts/local-cluster up) per test module, stopped (and checked to
leave nothing running) at the end of the module."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from cluster_harness import SCRIPT, LocalCluster, alive, pids_of


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    args = getattr(request.module, "LOCAL_CLUSTER_ARGS", [])
    path = tmp_path_factory.mktemp("cluster")
    subprocess.run([str(SCRIPT), "up", str(path), *args], check=True, timeout=180)
    cluster = LocalCluster(path)
    daemon_pids = pids_of(path)
    try:
        yield cluster
    finally:
        pod_pids = [r["pid"] for r in json.loads((path / "pod-pids.json").read_text() or "[]")] \
            if (path / "pod-pids.json").exists() else []
        subprocess.run([str(SCRIPT), "down", str(path)], check=True, timeout=120)
        left = [p for p in daemon_pids + pod_pids if alive(p)]
        assert not left, f"`down` left processes running: {left}"
