"""Prometheus (the Debian binary) scraping targets listed in file-based service discovery.

The process kubelet writes one JSON file per pod a PodMonitor selects into `targets_dir`
(Prometheus's file_sd format: [{"targets": ["127.0.0.2:8000"], "labels": {...}}]); Prometheus
re-reads the folder every second. Tests and the tuner can call `start_prometheus` alone and
write their own target files with `write_targets`.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .procs import Proc, free_port, http_ok, spawn, wait_until

__all__ = ["start_prometheus", "write_targets"]


def _binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise FileNotFoundError(
            "prometheus is not installed: run `apt-get install -y --no-install-recommends "
            "prometheus` (scripts/setup.sh does)")
    return found


def write_targets(targets_dir: Path, name: str, targets: list[str],
                  labels: dict[str, str] | None = None) -> Path:
    """Write (atomically) one file_sd file; an empty `targets` list removes it."""
    targets_dir.mkdir(parents=True, exist_ok=True)
    path = targets_dir / f"{name}.json"
    if not targets:
        path.unlink(missing_ok=True)
        return path
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": targets, "labels": labels or {}}]))
    os.replace(tmp, path)
    return path


def start_prometheus(workdir: str | Path, *, host: str = "127.0.0.1", port: int | None = None,
                     scrape_interval: str = "1s", targets_dir: str | Path | None = None,
                     timeout: float = 60.0) -> Proc:
    """Start Prometheus in `workdir` (config, TSDB, log); returns once /-/ready answers.

    Scrapes every target in `targets_dir/*.json` (default `workdir/targets`) at
    `scrape_interval`. The returned Proc has `.url` (http://host:port) and `.stop()`.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    targets = Path(targets_dir) if targets_dir else workdir / "targets"
    targets.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    config = workdir / "prometheus.yml"
    # JSON is YAML: no yaml dependency needed to write the config.
    config.write_text(json.dumps({
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "scrape_timeout": scrape_interval},
        "scrape_configs": [{
            "job_name": "pods", "metrics_path": "/metrics",
            "file_sd_configs": [{"files": [str(targets / "*.json")], "refresh_interval": "1s"}],
        }],
    }, indent=1))
    url = f"http://{host}:{port}"
    log = workdir / "prometheus.log"
    proc = spawn("prometheus", [
        _binary(), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={host}:{port}", "--storage.tsdb.retention.time=1d",
        "--web.enable-lifecycle", "--log.level=warn"], log, url=url)
    wait_until(lambda: http_ok(f"{url}/-/ready"), timeout, "prometheus", proc, log)
    return proc
