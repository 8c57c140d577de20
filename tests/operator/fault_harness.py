"""Fault injection for the operator tests: a flaky API server and a killable operator.

- `FaultyCluster`: the emulator of operator_harness, answering a seeded fraction of the
  API calls (not watch streams, not discovery) with a fault:
    "500"  a server error, nothing changed;
    "409"  a conflict on a write (POST/PATCH/PUT/DELETE), nothing changed;
    "slow" the call takes effect, but its answer comes `slow_seconds` late: longer than
           the client waits, so the client sees a timeout for a call that did happen.
  `kill_when(predicate, hook)` runs `hook` once, right after the first call matching the
  predicate took effect and before it is answered (to kill the operator mid-reconcile).
- `OperatorProcess`: the real operator (`paged_operator`'s handlers under `kopf.run`, as
  `python -m paged_operator` runs them) in a subprocess, so it can be SIGKILLed. Run as a
  script, this module is that process: it only shortens kopf's timeouts and backoffs, as
  the in-thread `Operator` of operator_harness does.
"""
from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TIMEOUT_S = 1.0   # the operator's (official client's) and kopf's request timeout


if __name__ != "__main__":
    import kmock
    from kmock._internal.k8s import KubernetesError  # the emulator's error answer
    from operator_harness import Cluster

    class FaultyCluster(Cluster):
        faults: dict[str, float] = {}   # fault -> fraction of eligible calls
        slow_seconds = 3 * CLIENT_TIMEOUT_S
        rng = random.Random(0)
        injected: collections.Counter = collections.Counter()
        _kill: tuple[Callable[[kmock.Request], bool], Callable[[], None]] | None = None

        def inject(self, *, seed: int, **faults: float) -> None:
            """inject(seed=1, e500=0.1, e409=0.05, slow=0.05); inject(seed=0) stops."""
            self.rng = random.Random(seed)
            self.faults = {k.removeprefix("e"): v for k, v in faults.items() if v}
            self.injected = collections.Counter()

        def kill_when(self, predicate: Callable[[kmock.Request], bool],
                      hook: Callable[[], None]) -> None:
            self._kill = (predicate, hook)

        def _pick(self, request: kmock.Request) -> str | None:
            if request.resource is None or request.action == kmock.action.WATCH:
                return None
            roll = self.rng.random()
            for fault, share in self.faults.items():
                if fault == "409" and request.method.value == "GET":
                    continue
                if roll < share:
                    return fault
                roll -= share
            return None

        async def _handle(self, request: kmock.Request) -> Any:
            fault = self._pick(request)
            if fault in ("500", "409"):
                self.injected[fault] += 1
                return await self._render_error(KubernetesError(
                    status=int(fault), reason="Injected", message=f"injected fault {fault}"))
            response = await super()._handle(request)
            if self._kill is not None and self._kill[0](request):
                hook, self._kill = self._kill[1], None
                hook()
                await asyncio.sleep(0.5)  # the caller is dead: nobody reads this answer
            if fault == "slow":
                self.injected[fault] += 1
                await asyncio.sleep(self.slow_seconds)
            return response


class OperatorProcess:
    """`python tests/operator/fault_harness.py`: the operator against $KUBECONFIG."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]),
            "PAGED_OPERATOR_API_TIMEOUT_SECONDS": str(CLIENT_TIMEOUT_S)}
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, __file__, env=env, cwd=ROOT, stdout=log,
                stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL)

    def kill(self) -> None:
        """SIGKILL: no cleanup handler runs, nothing is flushed (a node lost, an OOM kill)."""
        if self.proc is not None and self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=10)
            except asyncio.TimeoutError:
                self.kill()
        await self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


def _main() -> None:
    import kopf

    import paged_operator  # noqa: F401  (registers the operator's handlers)

    @kopf.on.startup()
    async def quick_retries(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.networking.request_timeout = CLIENT_TIMEOUT_S
        settings.networking.error_backoffs = [0.1, 0.2, 0.3]
        settings.watching.reconnect_backoff = 0.1
        settings.batching.batch_window = 0.01
        settings.batching.exit_timeout = 2

    kopf.configure(verbose=False)
    kopf.run(standalone=True, clusterwide=True, liveness_endpoint=None)


if __name__ == "__main__":
    _main()
