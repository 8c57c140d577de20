"""The backends the router may send to: membership, in-flight counts, health, load.

Membership comes from `--backends` or from discovery (`set_urls`); health from failed
requests (`eject`) and from probing `/health` every interval, which also brings ejected
backends back; load from the router's own in-flight counts plus `vllm:kv_cache_usage_perc`
and `vllm:num_requests_waiting` scraped from each backend's `/metrics`.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from paged_router.metrics import RouterMetrics

logger = logging.getLogger("paged_router")
SCRAPED = {"vllm:kv_cache_usage_perc": "kv_cache_usage", "vllm:num_requests_waiting": "waiting"}


@dataclass(eq=False)
class Backend:
    url: str
    in_flight: int = 0
    healthy: bool = True
    ejected_at: float | None = None
    kv_cache_usage: float = 0.0
    waiting: float = 0.0


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"backend {url!r}: give a URL like http://10.0.0.5:8000")
    return url


def parse_metrics(text: str) -> dict[str, float]:
    """Sums of the scraped gauges over their label sets (one model per engine); {} for
    text that is not Prometheus's exposition format."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in SCRAPED:
                    key = SCRAPED[sample.name]
                    out[key] = out.get(key, 0.0) + sample.value
    except ValueError:
        return {}
    return out


class BackendPool:
    def __init__(self, metrics: RouterMetrics, *, health_interval: float = 1.0,
                 probe_timeout: float = 2.0, scrape: bool = True) -> None:
        self.metrics = metrics
        self.health_interval, self.probe_timeout, self.scrape = \
            health_interval, probe_timeout, scrape
        self._backends: dict[str, Backend] = {}
        self._task: asyncio.Task | None = None
        self._client: httpx.AsyncClient | None = None
        self._change: asyncio.Event | None = None   # set at the next membership/health change

    # -- membership ------------------------------------------------------------------
    def set_urls(self, urls: Iterable[str]) -> None:
        wanted = {normalize_url(u) for u in urls}
        for url in list(self._backends):
            if url not in wanted:
                logger.info("backend left: %s", url)
                del self._backends[url]
        for url in sorted(wanted - self._backends.keys()):
            logger.info("backend joined: %s", url)
            self._backends[url] = Backend(url)
        self._export()

    def all(self) -> list[Backend]:
        return [self._backends[u] for u in sorted(self._backends)]

    def available(self) -> list[Backend]:
        return [b for b in self.all() if b.healthy]

    def get(self, url: str) -> Backend | None:
        return self._backends.get(url)

    async def wait_available(self, timeout: float) -> list[Backend]:
        """The available backends, waiting up to `timeout` s for a first one (a service
        scaled to zero while its first replica starts); [] when none came."""
        deadline = time.monotonic() + timeout
        while not (found := self.available()):
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            if self._change is None:
                self._change = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._change.wait(), left)
        return found

    # -- health ----------------------------------------------------------------------
    def eject(self, backend: Backend, reason: str) -> None:
        """Stop sending to a backend until a `/health` probe answers 200 again."""
        if backend.healthy:
            logger.warning("ejecting backend %s: %s", backend.url, reason)
            self.metrics.ejections.labels(backend=backend.url, reason=reason).inc()
        backend.healthy, backend.ejected_at = False, time.monotonic()
        self._export()

    def _restore(self, backend: Backend) -> None:
        if not backend.healthy:
            logger.info("backend healthy again: %s", backend.url)
        backend.healthy, backend.ejected_at = True, None
        self._export()

    async def probe(self, backend: Backend) -> None:
        assert self._client is not None
        try:
            status = (await self._client.get(backend.url + "/health")).status_code
        except httpx.HTTPError as exc:
            if backend.healthy:
                self.eject(backend, "probe_failed")
            logger.debug("probe %s: %s", backend.url, exc)
            return
        if status != 200:
            if backend.healthy:
                self.eject(backend, f"probe_{status}")
            return
        self._restore(backend)
        if self.scrape:
            try:
                text = (await self._client.get(backend.url + "/metrics")).text
            except httpx.HTTPError:
                return
            for key, value in parse_metrics(text).items():
                setattr(backend, key, value)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(b) for b in self.all()))

    async def _loop(self) -> None:
        while True:
            try:
                await self.probe_all()
            except Exception:  # never let one bad scrape end the loop
                logger.exception("health probing failed")
            await asyncio.sleep(self.health_interval)

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self.probe_timeout)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    def _export(self) -> None:
        self.metrics.backends.labels(state="healthy").set(len(self.available()))
        self.metrics.backends.labels(state="ejected").set(len(self._backends)
                                                          - len(self.available()))
        if self._change is not None:   # wake the requests waiting for a backend
            self._change.set()
            self._change = None
