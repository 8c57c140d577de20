"""`scripts/local-cluster` itself: `up` refuses a second start, `status` notices a crashed
daemon, and `down` still stops what the crash left (pod processes, Prometheus)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from cluster_harness import SCRIPT, LocalCluster, alive, pids_of

pytestmark = pytest.mark.xdist_group("local_cluster_lifecycle")

POD = """
apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  containers:
  - {name: c, image: none, command: [python, -c, "import time; time.sleep(600)"]}
"""


def test_down_after_a_daemon_crash(tmp_path: Path) -> None:
    run = lambda *a: subprocess.run([str(SCRIPT), *a], capture_output=True, text=True,  # noqa
                                    timeout=120)
    assert run("up", str(tmp_path), "--no-operator", "--no-postgres").returncode == 0
    try:
        again = run("up", str(tmp_path), "--no-postgres")
        assert again.returncode != 0 and "already runs" in again.stderr
        cluster = LocalCluster(tmp_path)
        cluster.kubectl("apply", "-f", "-", stdin=POD)
        pod_pid = cluster.wait_for(lambda: [p["pid"] for p in json.loads(
            (tmp_path / "pod-pids.json").read_text() or "[]")], 30, "the pod's process")[0]
        records = {r["name"]: r["pid"] for r in json.loads((tmp_path / "pids.json").read_text())}
        os.kill(records["daemon"], signal.SIGKILL)          # a crash: no clean-up at all
        cluster.wait_for(lambda: not alive(records["daemon"]), 10, "the daemon to die")
        status = run("status", str(tmp_path))
        assert status.returncode == 1 and "NOT RUNNING" in status.stdout
        assert alive(pod_pid)                               # orphaned, still running
    finally:
        down = run("down", str(tmp_path))
    assert down.returncode == 0, down.stderr
    assert not alive(pod_pid) and not any(alive(p) for p in records.values())
    assert "nothing was running" in run("down", str(tmp_path)).stdout
    assert pids_of(tmp_path) == []
