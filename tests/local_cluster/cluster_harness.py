"""Helpers for the local-cluster tests: kubectl against a cluster made by scripts/local-cluster."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / "bin" / "kubectl"
SCRIPT = ROOT / "scripts" / "local-cluster"


class LocalCluster:
    def __init__(self, path: Path) -> None:
        self.dir = path
        self.kubeconfig = path / "kubeconfig"

    @property
    def info(self) -> dict[str, Any]:
        return json.loads((self.dir / "cluster.json").read_text())

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(KUBECTL), *args], capture_output=True, text=True,
                              timeout=timeout, input=stdin,
                              env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n"
                                 f"{done.stdout}\n{done.stderr}")
        return done

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """bin/helm (Helm 4) against the cluster, with its own cache and config."""
        home = self.dir / "helm"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
               "HELM_DATA_HOME": str(home / "data")}
        done = subprocess.run([str(ROOT / "bin" / "helm"), *args], capture_output=True,
                              text=True, env=env, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return self.json("get", "pods", "-l", selector)["items"]

    def service_url(self, name: str, namespace: str = "default") -> str:
        return self.info["services"][f"{namespace}/{name}"]["url"]

    def wait_for(self, check: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if result := check():
                return result
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def pids_of(cluster_dir: Path) -> list[int]:
    path = cluster_dir / "pids.json"
    return [r["pid"] for r in json.loads(path.read_text())] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
