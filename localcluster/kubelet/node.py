"""The process kubelet: runs every pod of the emulated cluster as local processes, each pod
on its own loopback address (127.0.0.2, .3, ...), and finishes the deletion of pods once
their processes are gone. It reads and writes the API server's store in-process."""
from __future__ import annotations

import asyncio
import copy
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..api.server import ApiServer
from ..api.store import Event
from ..procs import alive, start_time
from .pods import PodWorker

CLAIMS = Path(tempfile.gettempdir()) / "paged-localcluster-addresses"

TERMINAL = ("Succeeded", "Failed")


def release_stale_claims() -> None:
    """Remove address claims whose process is gone (a crashed daemon's)."""
    for path in CLAIMS.glob("*") if CLAIMS.exists() else []:
        try:
            pid, started = path.read_text().split()
        except (OSError, ValueError):
            continue
        if not alive(int(pid), started):
            path.unlink(missing_ok=True)


class AddressPool:
    """Loopback addresses 127.0.<block>.2-254, lowest free first. Several local clusters may
    run on one machine (tests in parallel): each address is claimed machine-wide by a file
    in CLAIMS naming the claiming process; a claim whose process is gone is taken over."""

    def __init__(self, block: int) -> None:
        self.candidates = [f"127.0.{block}.{i}" for i in range(2, 255)]
        self.used: set[str] = set()
        self.owner = f"{os.getpid()} {start_time(os.getpid())}"
        CLAIMS.mkdir(parents=True, exist_ok=True)

    def _claim(self, ip: str) -> bool:
        path = CLAIMS / ip
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid, started = path.read_text().split()
            except (OSError, ValueError):
                return False
            if alive(int(pid), started):
                return False
            path.unlink(missing_ok=True)   # left by a process that is gone
            return self._claim(ip)
        with os.fdopen(fd, "w") as f:
            f.write(self.owner)
        return True

    def take(self) -> str:
        for ip in self.candidates:
            if ip not in self.used and self._claim(ip):
                self.used.add(ip)
                return ip
        raise RuntimeError("no loopback address left in the pool (253 in use)")

    def give_back(self, ip: str) -> None:
        if ip in self.used:
            self.used.discard(ip)
            (CLAIMS / ip).unlink(missing_ok=True)

    def release_all(self) -> None:
        for ip in list(self.used):
            self.give_back(ip)


class Kubelet:
    def __init__(self, api: ApiServer, cluster_dir: Path, kubeconfig: Path) -> None:
        self.api, self.dir, self.kubeconfig = api, cluster_dir, kubeconfig
        self.pod_ips = AddressPool(0)
        self.workers: dict[str, PodWorker] = {}   # by pod uid
        self.tasks: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        # namespace -> the Service variables of its pods (the daemon sets the network's)
        self.service_env: Callable[[str], dict[str, str]] = lambda namespace: {}
        api.store.graceful_pods = True
        api.store.hooks.append(self._on_event)
        api.log_source = self.log_path

    def kind(self, plural: str) -> Any:
        group, version = {"deployments": ("apps", "v1"), "replicasets": ("apps", "v1"),
                          "jobs": ("batch", "v1"),
                          "endpointslices": ("discovery.k8s.io", "v1"),
                          "podmonitors": ("monitoring.coreos.com", "v1")}.get(plural, ("", "v1"))
        return self.api.catalog.find(group, version, plural)

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.api.store.get(self.kind(plural), namespace, name)

    def _on_event(self, event: Event) -> None:
        self.wake.set()

    def sync(self) -> None:
        """Start a worker for every pod that has none and has not finished."""
        for pod in list(self.api.store.items(self.kind("pods"))):
            meta = pod["metadata"]
            if meta["uid"] in self.workers:
                continue
            if meta.get("deletionTimestamp"):
                self.finish_deletion(meta["namespace"], meta["name"], meta["uid"])
                continue
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                continue
            worker = PodWorker(self, pod, self.pod_ips.take())
            self.workers[meta["uid"]] = worker
            task = asyncio.get_running_loop().create_task(worker.run())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def forget(self, worker: PodWorker) -> None:
        self.workers.pop(worker.uid, None)
        self.pod_ips.give_back(worker.ip)

    def finish_deletion(self, namespace: str, name: str, uid: str) -> None:
        pod = self.get("pods", namespace, name)
        if pod is not None and pod["metadata"]["uid"] == uid:
            self.api.store.delete(self.kind("pods"), namespace, name, grace=0)

    def write_pod_status(self, namespace: str, name: str, uid: str,
                         status: dict[str, Any]) -> None:
        pod = self.get("pods", namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid or pod.get("status") == status:
            return
        new = copy.deepcopy(pod)
        new["status"] = status
        self.api.store.update(self.kind("pods"), new)

    def log_path(self, namespace: str, name: str, container: str | None,
                 previous: bool) -> Path | None:
        pod = self.get("pods", namespace, name)
        if pod is None:
            return None
        worker = self.workers.get(pod["metadata"]["uid"])
        if worker is None:
            return None
        log = worker.dir / "logs" / f"{container}.log"
        return log.with_suffix(".previous.log") if previous else log

    def pids(self) -> dict[str, list[int]]:
        return {f"{w.namespace}/{w.name}": w.pids() for w in self.workers.values()}

    async def shutdown(self) -> None:
        await asyncio.gather(*(w.terminate(5) for w in list(self.workers.values())))
        for task in list(self.tasks):
            task.cancel()
        self.pod_ips.release_all()
