"""Container probes as the kubelet runs them: httpGet, tcpSocket and exec, each with its
failure/success thresholds. Periods are capped at PERIOD_CAP seconds so that a laptop
cluster turns Ready within a second of the engine being ready; the failure threshold is
scaled up by the same factor, so a probe still gives up after periodSeconds x
failureThreshold seconds, as the manifest asked."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp

PERIOD_CAP = 1.0


def resolve_port(port: Any, container: dict[str, Any]) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"port {port!r} is not named in the container's ports")


@dataclass
class Probe:
    spec: dict[str, Any]
    container: dict[str, Any]
    failures: int = 0
    successes: int = 0
    passed: bool = False           # the current verdict after thresholds
    last_run: float = field(default=-1e9)
    message: str = ""

    @property
    def period(self) -> float:
        return min(float(self.spec.get("periodSeconds", 10)), PERIOD_CAP)

    @property
    def failure_threshold(self) -> int:
        period = float(self.spec.get("periodSeconds", 10))
        scale = max(1, round(period / self.period))
        return int(self.spec.get("failureThreshold", 3)) * scale

    @property
    def initial_delay(self) -> float:
        return float(self.spec.get("initialDelaySeconds", 0))

    async def _check(self, ip: str) -> tuple[bool, str]:
        timeout = float(self.spec.get("timeoutSeconds", 1))
        if "httpGet" in self.spec:
            get = self.spec["httpGet"]
            port = resolve_port(get["port"], self.container)
            url = f"http://{ip}:{port}{get.get('path', '/')}"
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                        total=timeout)) as session, session.get(url) as response:
                    ok = 200 <= response.status < 400
                    return ok, f"HTTP probe failed with statuscode: {response.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                return False, f'Get "{url}": {type(e).__name__}'
        if "tcpSocket" in self.spec:
            port = resolve_port(self.spec["tcpSocket"]["port"], self.container)
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
                writer.close()
                return True, ""
            except (OSError, asyncio.TimeoutError) as e:
                return False, f"dial tcp {ip}:{port}: {type(e).__name__}"
        if "exec" in self.spec:
            proc = await asyncio.create_subprocess_exec(
                *self.spec["exec"]["command"], stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
            try:
                return await asyncio.wait_for(proc.wait(), timeout) == 0, "exec probe failed"
            except asyncio.TimeoutError:
                proc.kill()
                return False, "exec probe timed out"
        return True, ""

    async def run(self, ip: str, now: float, started: float) -> bool:
        """Run the probe if its period has passed; returns the current verdict."""
        if now - started < self.initial_delay or now - self.last_run < self.period:
            return self.passed
        self.last_run = now
        ok, message = await self._check(ip)
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.passed = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            self.message = message
            if self.failures >= self.failure_threshold:
                self.passed = False
        return self.passed

    def exhausted(self) -> bool:
        return self.failures >= self.failure_threshold
