"""Scale check: N PagedInferenceServices into the emulated API server, time to all children.

    python benchmarks/operator_scale.py [--count 100] [--resync 60]

Runs the real operator (kopf, in its own thread, as in tests/operator) against kmock's
KubernetesEmulator over HTTP, creates --count resources at once, and reports how long
until every Deployment exists, until every status has conditions, and until everything
is gone again after deleting them. A measurement, not a test: it asserts nothing about
speed; the emulator is in-process Python, so the figures bound the operator's own cost.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "tests" / "operator")]

import kmock  # noqa: E402
from operator_harness import (DEPLOYMENTS, PIS, RESOURCES, Cluster,  # noqa: E402
                              Operator, api_path, pis_body)


class ScaleCluster(Cluster):
    """kmock routes each request by scanning its whole request log (O(log length) per
    request, so O(n^2) over a run). Drop answered requests from the log so that the
    figures measure the operator, not the mock's history; count requests here instead."""

    KEEP = 20
    counts: dict[str, int]
    answered: set[int]

    async def _handle(self, request: kmock.Request):  # type: ignore[override]
        if request.resource is not None:
            self.counts[request.method.value] = self.counts.get(request.method.value, 0) + 1
        if len(self._requests) > self.KEEP:  # requests still in flight must stay routable
            self._requests[:] = [r for r in self._requests if id(r) not in self.answered]
            self.answered.clear()
        try:
            return await super()._handle(request)
        finally:
            self.answered.add(id(request))


async def wait_until(check, *, timeout: float) -> float:
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"timed out after {timeout} s")
        await asyncio.sleep(0.02)
    return time.perf_counter() - start


async def run(count: int, resync: float, timeout: float) -> None:
    async with ScaleCluster() as cluster, kmock.Server(cluster) as server:
        cluster.counts, cluster.answered = {}, set()
        for resource, info in RESOURCES.items():
            cluster.declare(resource, **info)
        kubeconfig = Path(tempfile.mkdtemp()) / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: s\n"
            f"clusters: [{{name: s, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: s, user: {token: scale}}]\n"
            "contexts: [{name: s, context: {cluster: s, user: s}}]\n")
        os.environ.update(KUBECONFIG=str(kubeconfig), PAGED_OPERATOR_RESYNC_SECONDS=str(resync))
        operator = Operator()
        await operator.start()
        try:
            spec = {"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}, "engine": {"blockSize": 16}}
            client = server.client
            start = time.perf_counter()
            responses = await asyncio.gather(*[
                client.post(api_path(PIS), json=pis_body(f"svc-{i:03d}", spec))
                for i in range(count)])
            assert all(r.status == 200 for r in responses)
            created = time.perf_counter() - start
            deployments = created + await wait_until(
                lambda: len(cluster.live(DEPLOYMENTS)) == count, timeout=timeout)
            statuses = deployments + await wait_until(lambda: all(
                (o.get("status") or {}).get("conditions") for o in cluster.live(PIS).values())
                and len(cluster.live(PIS)) == count, timeout=timeout)
            requests = sum(cluster.counts.values())
            posts = cluster.counts.get("POST", 0)

            start = time.perf_counter()
            await asyncio.gather(*[client.delete(api_path(PIS, f"svc-{i:03d}"))
                                   for i in range(count)])
            gone = await wait_until(lambda: not cluster.live(PIS)
                                    and not cluster.live(DEPLOYMENTS), timeout=timeout)
        finally:
            await operator.stop()

    print(f"operator scale check: {count} PagedInferenceServices, kmock emulator over HTTP, "
          f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print(f"| {'phase':<44} | {'seconds':>8} | {'ms per resource':>15} |")
    print(f"|{'-' * 46}|{'-' * 10}|{'-' * 17}|")
    for label, seconds in (("all resources POSTed", created),
                           ("all Deployments exist", deployments),
                           ("all statuses have conditions", statuses),
                           ("after deleting: resources and children gone", gone)):
        print(f"| {label:<44} | {seconds:8.2f} | {1000 * seconds / count:15.1f} |")
    print(f"API requests until statuses settled: {requests} "
          f"({requests / count:.1f} per resource), POSTs: {posts} "
          f"({(posts - count) / count:.1f} children per resource)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--resync", type=float, default=60.0,
                        help="drift-check period, seconds (the operator's default)")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count must be >= 1")
    asyncio.run(run(args.count, args.resync, args.timeout))


if __name__ == "__main__":
    main()
