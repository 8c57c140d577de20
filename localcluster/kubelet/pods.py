"""One pod as local processes: start each container, follow its probes, restart it with
back-off after an exit, stop it when the pod is deleted (its preStop hook first, then
SIGTERM, SIGKILL when the grace period, counted from the deletion, is over), and write the
Pod's status as a kubelet would."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api.store import now
from .launch import CannotRun, Launch, host_python, launch, volumes
from .probes import Probe

TICK = 0.25
BACKOFF_START, BACKOFF_CAP = 1.0, 30.0     # a real kubelet: 10 s doubling to 5 min
MESSAGE_LINES, MESSAGE_BYTES = 80, 2048    # terminationMessagePolicy FallbackToLogsOnError


def log_tail(path: Path) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64 * 1024))
        lines = f.read().decode(errors="replace").splitlines()[-MESSAGE_LINES:]
    return "\n".join(lines)[-MESSAGE_BYTES:]


@dataclass
class Container:
    spec: dict[str, Any]
    log: Path
    popen: subprocess.Popen | None = None
    started_at: str = ""
    started_mono: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    last_terminated: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None    # final (no restart under the pod's policy)
    waiting: tuple[str, str] = ("ContainerCreating", "")
    probes: dict[str, Probe] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec["name"]

    def reset_probes(self) -> None:
        self.probes = {kind: Probe(self.spec[f"{kind}Probe"], self.spec)
                       for kind in ("startup", "readiness", "liveness")
                       if self.spec.get(f"{kind}Probe")}

    def started(self) -> bool:
        return self.popen is not None and ("startup" not in self.probes
                                           or self.probes["startup"].passed)

    def ready(self) -> bool:
        if not self.started():
            return False
        return "readiness" not in self.probes or self.probes["readiness"].passed


def stop_process(popen: subprocess.Popen, grace: float) -> None:
    """Blocking: SIGTERM the container's process group, SIGKILL it after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            break
        try:
            popen.wait(timeout=max(wait, 0.1))
            break
        except subprocess.TimeoutExpired:
            continue
    try:   # children left in the group after the leader exited
        os.killpg(popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class PodWorker:
    def __init__(self, kubelet: Any, pod: dict[str, Any], ip: str) -> None:
        self.kubelet, self.ip = kubelet, ip
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir: Path = kubelet.dir / "pods" / self.namespace / self.name
        self.containers = [Container(c, self.dir / "logs" / f"{c['name']}.log")
                           for c in pod["spec"]["containers"]]
        self.launches: dict[str, Launch] = {}
        self.start_time = now()
        self.config_error: str | None = None

    def pod(self) -> dict[str, Any] | None:
        pod = self.kubelet.get("pods", self.namespace, self.name)
        return pod if pod is not None and pod["metadata"]["uid"] == self.uid else None

    def pids(self) -> list[int]:
        return [c.popen.pid for c in self.containers if c.popen and c.popen.poll() is None]

    async def run(self) -> None:
        try:
            while (pod := self.pod()) is not None:
                if pod["metadata"].get("deletionTimestamp"):
                    await self.terminate(float(pod["metadata"].get(
                        "deletionGracePeriodSeconds", 30)))
                    self.kubelet.finish_deletion(self.namespace, self.name, self.uid)
                    return
                await self.step(pod)
                await asyncio.sleep(TICK)
            await self.terminate(0)
        finally:
            self.kubelet.forget(self)

    async def terminate(self, grace: float) -> None:
        """Each running container's preStop hook, then SIGTERM; the hook's time comes out
        of the grace period, as on a kubelet."""
        deadline = time.monotonic() + grace
        running = [c for c in self.containers if c.popen and c.popen.poll() is None]
        if grace > 0:
            await asyncio.gather(*(self._pre_stop(c, deadline) for c in running))
        left = max(0.0, deadline - time.monotonic())
        await asyncio.gather(*(asyncio.to_thread(stop_process, c.popen, left) for c in running
                               if c.popen is not None))
        for c in self.containers:
            c.popen = None
        shutil.rmtree(self.dir, ignore_errors=True)

    async def _pre_stop(self, c: Container, deadline: float) -> None:
        """lifecycle.preStop: `exec` (in the container's environment and directory) or
        `sleep`, cut short at the deadline; a failing hook is logged, and the stop goes on."""
        hook = (c.spec.get("lifecycle") or {}).get("preStop") or {}
        timeout = max(0.0, deadline - time.monotonic())
        if "sleep" in hook:
            await asyncio.sleep(min(float(hook["sleep"]["seconds"]), timeout))
            return
        if "exec" not in hook:
            return
        spec = self.launches.get(c.name)
        proc = await asyncio.create_subprocess_exec(
            *host_python(list(hook["exec"]["command"])), env=spec.env if spec else None,
            cwd=spec.cwd if spec else None, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        try:
            code = await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            code = None
        if code != 0:
            with open(c.log, "a") as out:
                out.write(f"[local kubelet] preStop hook "
                          f"{'timed out' if code is None else f'exited with {code}'}\n")

    def _prepare(self, pod: dict[str, Any]) -> None:
        vols = volumes(pod, self.dir, self.kubelet.dir, self.kubelet.get)
        for c in self.containers:
            self.launches[c.name] = launch(pod, c.spec, self.ip, vols, self.dir,
                                           self.kubelet.kubeconfig, self.kubelet.get,
                                           services=self.kubelet.service_env)

    async def step(self, pod: dict[str, Any]) -> None:
        mono = time.monotonic()
        if not self.launches:
            try:
                self._prepare(pod)
                self.config_error = None
            except CannotRun as e:
                self.config_error = str(e)
                for c in self.containers:
                    c.waiting = ("CreateContainerConfigError", str(e))
        policy = pod["spec"].get("restartPolicy", "Always")
        for c in self.containers:
            if c.popen is not None and (code := c.popen.poll()) is not None:
                self._exited(c, code, policy, mono)
            if c.popen is None and c.terminated is None and self.launches and mono >= c.next_start:
                self._start(c, mono)
            if c.popen is not None:
                await self._probe(c, mono)
        self.kubelet.write_pod_status(self.namespace, self.name, self.uid, self.status(pod))

    def _start(self, c: Container, mono: float) -> None:
        spec = self.launches[c.name]
        c.log.parent.mkdir(parents=True, exist_ok=True)
        if c.log.exists() and c.restarts:
            os.replace(c.log, c.log.with_suffix(".previous.log"))
        with open(c.log, "ab") as out:
            try:
                c.popen = subprocess.Popen(spec.argv, env=spec.env, cwd=spec.cwd, stdout=out,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
            except OSError as e:
                c.waiting = ("RunContainerError", str(e))
                c.next_start = mono + BACKOFF_START * 2 ** min(c.restarts, 5)
                c.restarts += 1
                return
        c.started_at, c.started_mono = now(), mono
        c.reset_probes()

    def _exited(self, c: Container, code: int, policy: str, mono: float) -> None:
        code = 128 - code if code < 0 else code    # killed by signal N: 128 + N, as in a shell
        state = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                 "startedAt": c.started_at, "finishedAt": now(),
                 "containerID": f"local://{c.popen.pid if c.popen else 0}"}
        if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            state["message"] = log_tail(c.log)   # (policy File: nothing writes the file here)
        c.popen = None
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if not restart:
            c.terminated = state
            return
        c.last_terminated = state
        delay = min(BACKOFF_START * 2 ** c.restarts, BACKOFF_CAP)
        c.restarts += 1
        c.next_start = mono + delay
        c.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container="
                     f"{c.name} pod={self.name}")

    async def _probe(self, c: Container, mono: float) -> None:
        startup = c.probes.get("startup")
        if startup is not None and not startup.passed:
            await startup.run(self.ip, mono, c.started_mono)
            if not startup.passed and startup.exhausted():
                await self._kill_for_probe(c, "startup", startup.message)
            return
        if "readiness" in c.probes:
            await c.probes["readiness"].run(self.ip, mono, c.started_mono)
        liveness = c.probes.get("liveness")
        if liveness is not None:
            await liveness.run(self.ip, mono, c.started_mono)
            if liveness.exhausted():
                await self._kill_for_probe(c, "liveness", liveness.message)

    async def _kill_for_probe(self, c: Container, kind: str, message: str) -> None:
        if c.popen is None:
            return
        grace = float((self.pod() or {}).get("spec", {}).get("terminationGracePeriodSeconds", 30))
        popen = c.popen
        await asyncio.to_thread(stop_process, popen, grace)
        with open(c.log, "a") as out:
            out.write(f"[local kubelet] {kind} probe failed ({message}); restarting\n")

    def status(self, pod: dict[str, Any]) -> dict[str, Any]:
        statuses = []
        for c in self.containers:
            if c.terminated is not None:
                state = {"terminated": c.terminated}
            elif c.popen is not None:
                state = {"running": {"startedAt": c.started_at}}
            else:
                reason, message = c.waiting
                state = {"waiting": {"reason": reason, **({"message": message}
                                                          if message else {})}}
            statuses.append({"name": c.name, "image": c.spec.get("image", ""), "imageID": "",
                             "containerID": f"local://{c.popen.pid}" if c.popen else "",
                             "ready": c.ready(), "started": c.started(),
                             "restartCount": c.restarts, "state": state,
                             "lastState": {"terminated": c.last_terminated}
                             if c.last_terminated else {}})
        finals = [c.terminated for c in self.containers]
        if all(finals):
            phase = "Succeeded" if all(f["exitCode"] == 0 for f in finals) else "Failed"
        elif any(c.popen is not None or c.restarts for c in self.containers):
            phase = "Running"
        else:
            phase = "Pending"
        ready = all(c.ready() for c in self.containers) and phase == "Running"
        old = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}

        def cond(type_: str, ok: bool) -> dict[str, Any]:
            status = "True" if ok else "False"
            prev = old.get(type_)
            since = prev["lastTransitionTime"] if prev and prev["status"] == status else now()
            return {"type": type_, "status": status, "lastTransitionTime": since}
        return {"phase": phase, "hostIP": "127.0.0.1", "podIP": self.ip,
                "podIPs": [{"ip": self.ip}], "startTime": self.start_time, "qosClass": "Burstable",
                "conditions": [cond("PodScheduled", True), cond("Initialized", True),
                               cond("ContainersReady", ready), cond("Ready", ready)],
                "containerStatuses": statuses}
