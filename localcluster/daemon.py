"""`python -m localcluster daemon DIR --port N`: the emulated API server, the process
kubelet, the controllers and the Service forwarders in one event loop. `up` starts it
detached; SIGTERM stops every pod process before it exits."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

import kmock

from .api import ApiServer
from .kubelet.controllers import Controllers
from .kubelet.network import Network
from .kubelet.node import Kubelet
from .procs import start_time

RESYNC = 0.5


async def serve(cluster_dir: Path, host: str, port: int, info: dict[str, str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with ApiServer() as api, kmock.Server(api, host=host, port=port):
        kubelet = Kubelet(api, cluster_dir, cluster_dir / "kubeconfig")
        controllers = Controllers(kubelet)
        network = Network(kubelet, cluster_dir, {"api": f"http://{host}:{port}", **info})
        kubelet.service_env = network.service_env
        written = ""
        try:
            while not stop.is_set():
                kubelet.wake.clear()
                controllers.reconcile()
                kubelet.sync()
                await network.sync()
                pids = [{"pid": p, "started": start_time(p)} for ps in kubelet.pids().values()
                        for p in ps]
                if json.dumps(pids) != written:   # for `down` after a crash of this daemon
                    written = json.dumps(pids)
                    (cluster_dir / "pod-pids.json").write_text(written)
                try:
                    await asyncio.wait_for(kubelet.wake.wait(), RESYNC)
                    await asyncio.sleep(0.02)      # batch a burst of events into one pass
                except asyncio.TimeoutError:
                    pass
        finally:
            network.close()
            await kubelet.shutdown()
            (cluster_dir / "pod-pids.json").write_text("[]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m localcluster daemon")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--info", default="{}", help="JSON merged into cluster.json")
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    asyncio.run(serve(args.dir.resolve(), args.host, args.port, json.loads(args.info)))
