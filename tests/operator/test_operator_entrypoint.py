"""`python -m paged_operator` as a real process: liveness endpoint, namespace scoping,
clean exit on SIGTERM (what the chart's Deployment runs)."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import aiohttp
import pytest
from operator_harness import DEPLOYMENTS, NAMESPACE, PIS, ROOT, api_path, call, eventually, \
    pis_body

pytestmark = pytest.mark.asyncio


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_module_entrypoint_serves_liveness_and_watches_its_namespace(cluster):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "paged_operator", f"--liveness=http://127.0.0.1:{port}/healthz",
        "--namespace", NAMESPACE, env=env, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with aiohttp.ClientSession() as session:
            async def alive() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        return resp.status == 200
                except aiohttp.ClientConnectionError:
                    return False
            for _ in range(200):
                if await alive():
                    break
                assert proc.returncode is None, "the operator exited early"
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("no liveness answer within 20 s")
        await call(cluster, "POST", api_path(PIS), pis_body("svc", {"model": {"uri": "a/b"}}))
        await call(cluster, "POST", api_path(PIS, namespace="other"),
                   pis_body("elsewhere", {"model": {"uri": "a/b"}}, namespace="other"))
        await eventually(lambda: (NAMESPACE, "svc") in cluster.live(DEPLOYMENTS))
        await asyncio.sleep(0.5)
        assert ("other", "elsewhere") not in cluster.live(DEPLOYMENTS)  # not its namespace
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, output.decode()[-2000:]
