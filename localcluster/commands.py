"""`scripts/local-cluster up|down|status DIR` (also `python -m localcluster`).

up:     Prometheus, PostgreSQL, the API server + process kubelet (daemon), the chart's CRDs,
        then the real operator; writes DIR/kubeconfig and DIR/cluster.json and returns
        once everything answers. Everything runs detached; pids go to DIR/pids.json.
down:   stops all of it (also what a crashed `up` or daemon left: recorded pids whose start
        time still matches), removes PostgreSQL's data directory.
status: says what runs and prints cluster.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path

import yaml

from .kubelet.node import release_stale_claims
from .postgres import remove_postgres_data, start_postgres
from .procs import (Proc, free_port, http_ok, load_pids, save_pids, spawn, stop_group,
                    wait_until)
from .prometheus import start_prometheus

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "charts" / "paged-inference-operator" / "crds"


def kubeconfig(api: str) -> str:
    return ("apiVersion: v1\nkind: Config\ncurrent-context: local\n"
            f"clusters: [{{name: local, cluster: {{server: '{api}'}}}}]\n"
            "users: [{name: local, user: {token: local}}]\n"
            "contexts: [{name: local, context: {cluster: local, user: local, "
            "namespace: default}}]\n")


def apply_crds(api: str) -> None:
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            req = urllib.request.Request(
                f"{api}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                data=json.dumps(doc).encode(), method="POST",
                headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=10).close()
            except urllib.error.HTTPError as e:
                if e.code != 409:
                    raise


def up(cluster_dir: Path, with_operator: bool = True, with_postgres: bool = True,
       timeout: float = 120.0) -> dict:
    cluster_dir.mkdir(parents=True, exist_ok=True)
    if any(p.alive() for p in load_pids(cluster_dir / "pids.json")):
        raise SystemExit(f"a local cluster already runs in {cluster_dir}: "
                         f"`scripts/local-cluster down {cluster_dir}` first")
    procs: list[Proc] = []
    try:
        prom = start_prometheus(cluster_dir / "prometheus",
                                targets_dir=cluster_dir / "prometheus" / "targets")
        procs.append(prom)
        save_pids(cluster_dir / "pids.json", procs)
        info = {"prometheus": prom.url}
        if with_postgres:
            pg = start_postgres(cluster_dir / "postgres")
            procs.append(pg)
            info["postgres"] = pg.url
            save_pids(cluster_dir / "pids.json", procs)
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        (cluster_dir / "kubeconfig").write_text(kubeconfig(api))
        log = cluster_dir / "logs" / "daemon.log"
        daemon = spawn("daemon", [sys.executable, "-m", "localcluster", "daemon",
                                  str(cluster_dir), "--port", str(port),
                                  "--info", json.dumps(info)], log, url=api)
        procs.append(daemon)
        save_pids(cluster_dir / "pids.json", procs)
        wait_until(lambda: http_ok(f"{api}/readyz") and (cluster_dir / "cluster.json").exists(),
                   timeout, "the API server", daemon, log)
        apply_crds(api)
        if with_operator:
            op_port = free_port()
            log = cluster_dir / "logs" / "operator.log"
            env = {**os.environ, "KUBECONFIG": str(cluster_dir / "kubeconfig")}
            operator = spawn("operator", [sys.executable, "-m", "paged_operator",
                                          "--liveness", f"http://127.0.0.1:{op_port}/healthz",
                                          "--log-format", "plain"], log, env=env,
                             url=f"http://127.0.0.1:{op_port}/healthz")
            procs.append(operator)
            save_pids(cluster_dir / "pids.json", procs)
            wait_until(lambda: http_ok(operator.url), timeout, "the operator", operator, log)
    except BaseException:
        down(cluster_dir, quiet=True)
        raise
    return json.loads((cluster_dir / "cluster.json").read_text())


def down(cluster_dir: Path, quiet: bool = False) -> list[str]:
    stopped = []
    procs = load_pids(cluster_dir / "pids.json")
    order = {"operator": 0, "daemon": 1}
    for proc in sorted(procs, key=lambda p: order.get(p.name, 2)):
        if stop_group(proc.pid, proc.started, grace=30 if proc.name == "daemon" else 10):
            stopped.append(f"{proc.name} (pid {proc.pid})")
    pods = cluster_dir / "pod-pids.json"
    if pods.exists():   # pod processes a crashed daemon could not stop
        for rec in json.loads(pods.read_text() or "[]"):
            if stop_group(rec["pid"], rec.get("started"), grace=5):
                stopped.append(f"pod process (pid {rec['pid']})")
        pods.write_text("[]")
    remove_postgres_data(cluster_dir / "postgres")
    release_stale_claims()
    (cluster_dir / "pids.json").unlink(missing_ok=True)
    if not quiet:
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return stopped


def status(cluster_dir: Path) -> int:
    procs = load_pids(cluster_dir / "pids.json")
    if not procs:
        print(f"no local cluster in {cluster_dir}")
        return 1
    ok = True
    for proc in procs:
        alive = proc.alive()
        ok &= alive
        print(f"{proc.name:<11} pid {proc.pid:<8} {'running' if alive else 'NOT RUNNING'}"
              f"  {proc.url}")
    info = cluster_dir / "cluster.json"
    if info.exists():
        print(info.read_text())
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/local-cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status", "daemon"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--no-operator", action="store_true",
                        help="up: do not start the operator (tests run their own)")
    parser.add_argument("--no-postgres", action="store_true", help="up: skip PostgreSQL")
    args, rest = parser.parse_known_args(argv)
    if args.command == "daemon":
        from .daemon import main as daemon_main
        daemon_main([str(args.dir), *rest])
        return
    cluster_dir = args.dir.resolve()
    if args.command == "up":
        info = up(cluster_dir, with_operator=not args.no_operator,
                  with_postgres=not args.no_postgres)
        print(f"local cluster up in {cluster_dir}\n"
              f"  export KUBECONFIG={cluster_dir / 'kubeconfig'}\n"
              f"  API server:  {info['api']}\n  Prometheus:  {info['prometheus']}\n"
              f"  PostgreSQL:  {info.get('postgres', '(not started)')}\n"
              f"  Services:    listed in {cluster_dir / 'cluster.json'}")
    elif args.command == "down":
        down(cluster_dir)
    else:
        sys.exit(status(cluster_dir))
