"""The routing benchmark's processes and workload (benchmarks/bench_routing.py): engines and
routers as subprocesses, the engines' counters, the tenants' system prompts, and the load
generator (closed loop, or open loop at a Poisson rate)."""
from __future__ import annotations

import asyncio
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
WORDS = ("order refund shipping account invoice warranty return parcel courier payment card "
         "bank branch loan mortgage policy claim premium deductible patient clinic doctor "
         "appointment prescription lesson student teacher homework exam library ticket train "
         "platform delay hotel booking room breakfast checkout flight baggage gate").split()


class Proc:
    def __init__(self, args: list[str], pattern: str, log: Path) -> None:
        self.log = log.open("w")
        self.p = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url, seen = "", threading.Event()

        def pump() -> None:
            for line in self.p.stdout:  # type: ignore[union-attr]
                self.log.write(line)
                m = re.search(pattern + r" (http://[0-9.]+:\d+)", line)
                if m and not seen.is_set():
                    self.url = m.group(1)
                    seen.set()
        threading.Thread(target=pump, daemon=True).start()
        if not seen.wait(180):
            raise SystemExit(f"{' '.join(args[:2])} did not start; see {log}")

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise SystemExit(f"process exited; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"not ready in time; see {self.log.name}")

    def stop(self) -> None:
        self.p.kill()
        self.p.wait()


def samples(text: str):
    """The samples of one /metrics page (Prometheus text format)."""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def summed(urls: list[str], names: tuple[str, ...]) -> list[float]:
    """Each name's value summed over its label sets and over the engines."""
    out = dict.fromkeys(names, 0.0)
    for url in urls:
        for sample in samples(httpx.get(url + "/metrics", timeout=10).text):
            if sample.name in out:
                out[sample.name] += sample.value
    return [out[name] for name in names]


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    hits, queries = summed(urls, ("vllm:prefix_cache_hits_total",
                                  "vllm:prefix_cache_queries_total"))
    return hits, queries


def event_counters(urls: list[str]) -> tuple[float, float]:
    """(events, payload bytes) the engines have published so far."""
    events, size = summed(urls, ("paged:kv_events_published_total",
                                 "paged:kv_events_bytes_published_total"))
    return events, size


def system_prompts(url: str, n: int, lo: int, hi: int, seed: int) -> list[str]:
    """n texts of lo..hi tokens (measured with the engine's /tokenize)."""
    rng, out = random.Random(seed), []
    for i in range(n):
        target = rng.randint(lo, hi)
        words = [f"Tenant {seed}-{i} support rules:"]
        while True:
            words += rng.choices(WORDS, k=16)
            text = " ".join(words)
            size = len(httpx.post(url + "/tokenize", json={"prompt": text}).json()["tokens"])
            if size >= target:
                out.append(text)
                break
    return out


async def run_load(url: str, prompts: list[str], tenants: list[int], users: int,
                   max_tokens: int, seed: int, rate: float | None = None) -> dict:
    # url: one target, or several separated by commas (router replicas: request i goes to
    # target i mod n)
    """Closed loop: `users` workers take the next (tenant, question) until none is left.
    Open loop (`rate`): request i is sent at its Poisson arrival time (`rate` requests/s,
    seeded), whatever the server's latency, as the issue's peers measure a rate."""
    queue = list(enumerate(tenants))
    ttfts: list[float] = []
    out_tokens = errors = 0

    async def send(client: httpx.AsyncClient, i: int, tenant: int) -> None:
        nonlocal out_tokens, errors
        body = {"prompt": f"{prompts[tenant]}\nUser {seed}-{i}: question {i}?\nAnswer:",
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "temperature": 0}
        start, first = time.perf_counter(), None
        targets = url.split(",")
        try:
            async with client.stream("POST", targets[i % len(targets)] + "/v1/completions",
                                     json=body) as r:
                if r.status_code != 200:
                    errors += 1
                    return
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and first is None:
                        first = time.perf_counter() - start
                    if line.startswith("data: {"):
                        out_tokens += 1
        except httpx.HTTPError:
            errors += 1
            return
        if first is not None:
            ttfts.append(first)

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            await send(client, *queue.pop(0))

    async def arrivals(client: httpx.AsyncClient) -> None:
        rng, at, t0, tasks = random.Random(seed), 0.0, time.perf_counter(), []
        for i, tenant in queue:
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks.append(asyncio.create_task(send(client, i, tenant)))
        await asyncio.gather(*tasks)

    start = time.perf_counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        if rate:
            await arrivals(client)
        else:
            await asyncio.gather(*(worker(client) for _ in range(users)))
    wall = time.perf_counter() - start
    return {"ttfts": ttfts, "wall": wall, "out_tokens": out_tokens, "errors": errors}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else (values[0] if values else float("nan"))
