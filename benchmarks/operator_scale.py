"""Scale check: N PagedInferenceServices into an API server, time to all children.

    python benchmarks/operator_scale.py [--counts 100 300 1000] [--resync 120]

For each count, a fresh local-cluster API server (localcluster/api: the store, admission
with the CRDs' schemas and CEL rules, watches; no kubelet, so pods never exist) in this
process, the real operator as its own process (`python -m paged_operator`, as the chart
runs one replica), then --count resources created at once. Reports how long until every
Deployment exists, until every status has conditions, until the operator's last request
(none for 3 s after it), and until everything is gone again after deleting them; the
operator's API requests per resource up to its last request (by method and resource,
deletion not included), then those of one resync pass over every resource; the operator
process's peak RSS (VmHWM) and CPU time, beside the API server's CPU time. A measurement,
not a test: it asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kmock
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from localcluster.api import ApiServer  # noqa: E402

CRDS = ROOT / "charts" / "paged-inference-operator" / "crds"
GROUP = "serving.pagedinference.dev/v1alpha1"
NAMESPACE = "default"
QUIET_SECONDS = 3.0   # no request for this long: the operator is done with what it was given


class CountingApiServer(ApiServer):
    """Counts the requests it answers, by method (the operator's, once it runs)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.by_kind: collections.Counter[str] = collections.Counter()

    async def _handle(self, request: kmock.Request):  # type: ignore[override]
        self.counts[request.method.value] += 1
        watch = request.url.query.get("watch") in ("true", "1")
        self.by_kind[f"{request.method.value} {resource_of(str(request.url.path))}"
                     f"{' (watch)' if watch else ''}"] += 1
        return await super()._handle(request)


def resource_of(path: str) -> str:
    """`pods`, `deployments`, `pagedinferenceservices/status` ... of a request path."""
    parts = [p for p in path.split("/") if p]
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        parts = parts[parts.index("namespaces") + 2:]
        return parts[0] + ("/" + parts[2] if len(parts) > 2 else "")
    return parts[-1] if parts else "/"


async def wait_until(check, *, timeout: float) -> float:
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"timed out after {timeout} s")
        await asyncio.sleep(0.25)   # polls share this process with the API server
    return time.perf_counter() - start


async def wait_quiet(api: CountingApiServer, *, seconds: float, timeout: float) -> float:
    """Seconds until no request has arrived for `seconds` (the events that follow the last
    status write, e.g. each Deployment's ADDED, are the operator's requests too); the
    quiet stretch itself is not counted."""
    start = time.perf_counter()
    last, since = sum(api.counts.values()), time.perf_counter()
    while time.perf_counter() - since < seconds:
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"still busy after {timeout} s")
        await asyncio.sleep(0.25)
        now = sum(api.counts.values())
        if now != last:
            last, since = now, time.perf_counter()
    return since - start


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run(count: int, resync: float, timeout: float, *,
              resync_pass: bool = True) -> dict[str, Any]:
    """One count; `resync_pass`: also wait for and count the first resync pass."""
    async with CountingApiServer() as api, kmock.Server(api) as server:
        client = server.client
        for path in sorted(CRDS.glob("*.yaml")):
            for crd in yaml.safe_load_all(path.read_text()):
                response = await client.post(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
                assert response.status == 201, await response.text()
        pis_kind = api.catalog.find(*GROUP.split("/"), "pagedinferenceservices")
        deploy_kind = api.catalog.find("apps", "v1", "deployments")

        def live(kind: Any) -> list[dict[str, Any]]:
            return list(api.store.items(kind, NAMESPACE))

        kubeconfig = Path(tempfile.mkdtemp()) / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: s\n"
            f"clusters: [{{name: s, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: s, user: {token: scale}}]\n"
            "contexts: [{name: s, context: {cluster: s, user: s}}]\n")
        log = open(kubeconfig.with_name("operator.log"), "w")
        operator = subprocess.Popen(
            [sys.executable, "-m", "paged_operator", "--liveness", "", "--log-format", "plain",
             "--namespace", NAMESPACE],
            env={**os.environ, "KUBECONFIG": str(kubeconfig),
                 "PAGED_OPERATOR_RESYNC_SECONDS": str(resync),
                 "PYTHONPATH": str(ROOT / "operator")},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # ready once its watches stand: watched resources answer a first GET each
            await wait_until(lambda: "Initial authentication has finished" in
                             kubeconfig.with_name("operator.log").read_text(), timeout=120)
            await wait_until(lambda: api.counts["GET"] >= 3, timeout=60)
            await wait_quiet(api, seconds=QUIET_SECONDS, timeout=60)  # every watch is up
            before, kinds_before = dict(api.counts), collections.Counter(api.by_kind)
            cpu_before, own_before = cpu_seconds(operator.pid), time.process_time()
            spec = {"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}, "engine": {"blockSize": 16}}
            start = time.perf_counter()
            responses = await asyncio.gather(*[client.post(
                f"/apis/{GROUP}/namespaces/{NAMESPACE}/pagedinferenceservices",
                json={"apiVersion": GROUP, "kind": "PagedInferenceService",
                      "metadata": {"name": f"svc-{i:04d}"}, "spec": spec})
                for i in range(count)])
            assert all(r.status == 201 for r in responses)
            created = time.perf_counter() - start
            deployments = created + await wait_until(
                lambda: len(live(deploy_kind)) == count, timeout=timeout)
            statuses = deployments + await wait_until(lambda: all(
                (o.get("status") or {}).get("conditions") for o in live(pis_kind)),
                timeout=timeout)
            settled = statuses + await wait_quiet(api, seconds=QUIET_SECONDS, timeout=timeout)
            methods = {m: n - before.get(m, 0) - (count if m == "POST" else 0)
                       for m, n in api.counts.items()}   # the operator's, not our POSTs
            requests = sum(methods.values())
            kinds = api.by_kind - kinds_before
            kinds["POST pagedinferenceservices"] -= count
            rss = peak_rss_mib(operator.pid)
            cpu = cpu_seconds(operator.pid) - cpu_before
            server_cpu = time.process_time() - own_before

            # One resync pass of every resource: the first wave comes one interval after
            # each resource was seen. Every pass reads the resource's ConfigMap: the wave
            # runs from the first such read until all have been read and the operator is
            # quiet again (a stray request meanwhile, e.g. a watch renewal, counts too).
            quiet_total = sum(api.counts.values())
            wave, resync_requests = float("nan"), float("nan")
            if resync_pass:
                def reads() -> int:
                    return api.by_kind["GET configmaps"] - kinds_before["GET configmaps"]
                base_reads = reads()
                await wait_until(lambda: reads() > base_reads, timeout=resync + timeout)
                wave_start = time.perf_counter()
                await wait_until(lambda: reads() >= base_reads + count, timeout=timeout)
                await wait_quiet(api, seconds=QUIET_SECONDS, timeout=timeout)
                wave = time.perf_counter() - wave_start - QUIET_SECONDS
                resync_requests = sum(api.counts.values()) - quiet_total

            start = time.perf_counter()
            await asyncio.gather(*[client.delete(
                f"/apis/{GROUP}/namespaces/{NAMESPACE}/pagedinferenceservices/svc-{i:04d}")
                for i in range(count)])
            gone = await wait_until(lambda: not live(pis_kind) and not live(deploy_kind),
                                    timeout=timeout)
        finally:
            os.killpg(operator.pid, signal.SIGTERM)
            await asyncio.to_thread(operator.wait, 30)
            log.close()
    return {"count": count, "created": created, "deployments": deployments,
            "statuses": statuses, "settled": settled, "wave": wave,
            "resync_requests": resync_requests / count, "gone": gone, "requests": requests / count,
            "children": methods.get("POST", 0) / count, "rss": rss, "cpu": cpu,
            "server_cpu": server_cpu,
            "methods": ", ".join(f"{m} {n / count:.1f}" for m, n in sorted(methods.items())),
            "kinds": ", ".join(f"{k} {n / count:.2f}" for k, n in sorted(kinds.items()) if n > 0)}


def report(rows: list[dict[str, Any]]) -> None:
    print(f"operator scale check: the local cluster's API server, the operator as its own process, "
          f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print("| services | all POSTed | all Deployments | per resource | all statuses | "
          "per resource | last request | all gone after delete | API requests per resource | "
          "children per resource | operator peak RSS | operator CPU | API server CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        n = r["count"]
        print(f"| {n:.0f} | {r['created']:.2f} s | {r['deployments']:.2f} s | "
              f"{1000 * r['deployments'] / n:.1f} ms | {r['statuses']:.2f} s | "
              f"{1000 * r['statuses'] / n:.1f} ms | {r['settled']:.2f} s | {r['gone']:.2f} s | "
              f"{r['requests']:.1f} | {r['children']:.1f} | {r['rss']:.0f} MiB | "
              f"{r['cpu']:.1f} s | {r['server_cpu']:.1f} s |")
    for r in rows:
        print(f"{r['count']:.0f} services: one resync pass of all: {r['wave']:.2f} s, "
              f"{r['resync_requests']:.1f} API requests per resource")
    for r in rows:
        print(f"{r['count']:.0f} services: API requests per resource by method: {r['methods']}")
        print(f"{r['count']:.0f} services: by method and resource: {r['kinds']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--resync", type=float, default=120.0,
                        help="drift-check period, seconds (the operator's default is 60; "
                             "120 lets 1,000 creations settle before the first pass, so the "
                             "two are counted apart)")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if min(args.counts) < 1:
        parser.error("--counts must be >= 1")
    rows = []
    for count in args.counts:
        rows.append(asyncio.run(run(count, args.resync, args.timeout)))
        report(rows[-1:])
    if len(rows) > 1:
        report(rows)


if __name__ == "__main__":
    main()
