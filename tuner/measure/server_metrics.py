"""Scraping the engine's Prometheus /metrics and turning two scrapes into trial figures.

A trial scrapes once before the load and once after; counters and histogram buckets are
differenced, so warm-up requests never count. Quantiles come from the differenced buckets
exactly as PromQL's `histogram_quantile` computes them (linear within a bucket).
Label sets other than `le` (model_name, finished_reason, ...) are summed.
"""
from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

# vLLM metric names (prometheus_client adds `_total` to counters).
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
TIER_HITS = "vllm:prefix_cache_tier_hits_total"   # by medium: GPU, CPU, Disk
TIER_CAPACITY = "vllm:kv_offload_capacity_bytes"   # by medium: the tiers that are on


@dataclass(frozen=True)
class Snapshot:
    """Sample name -> summed value; histogram buckets keyed as (name, le)."""

    values: dict[str, float]
    buckets: dict[str, dict[float, float]]
    # a counter by its `medium` label (the KV tiers': vllm:prefix_cache_tier_hits_total)
    media: dict[str, dict[str, float]] = field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """A counter (with or without `_total`) or gauge, summed over label sets."""
        for candidate in (name, name + "_total"):
            if candidate in self.values:
                return self.values[candidate]
        return None


def parse(text: str) -> Snapshot:
    """Parse Prometheus text exposition into a Snapshot; ValueError on malformed text."""
    values: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    media: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") and "le" in sample.labels:
                le = float(sample.labels["le"])  # "+Inf" parses to inf
                buckets[sample.name[: -len("_bucket")]][le] += sample.value
            elif not sample.name.endswith("_created"):
                values[sample.name] += sample.value
                if "medium" in sample.labels:
                    media[sample.name][sample.labels["medium"]] += sample.value
    return Snapshot(dict(values), {k: dict(v) for k, v in buckets.items()},
                    {k: dict(v) for k, v in media.items()})


def scrape(base_url: str, *, timeout: float = 10.0) -> Snapshot:
    response = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout)
    response.raise_for_status()
    return parse(response.text)


def counter_delta(before: Snapshot, after: Snapshot, name: str) -> float | None:
    b, a = before.value(name), after.value(name)
    return None if a is None else a - (b or 0.0)


def histogram_delta(before: Snapshot, after: Snapshot, name: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) pairs of the observations made between the two scrapes."""
    b, a = before.buckets.get(name, {}), after.buckets.get(name, {})
    return sorted((le, count - b.get(le, 0.0)) for le, count in a.items())


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """PromQL's histogram_quantile on cumulative (le, count) pairs; None when empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    if not buckets or buckets[-1][0] != math.inf or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for i, (le, count) in enumerate(buckets):
        if count >= rank:
            if le == math.inf:  # the top bucket: Prometheus returns the highest finite bound
                return buckets[i - 1][0] if i > 0 else None
            if i == 0 and le <= 0:
                return le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return None


def server_figures(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """The server-side figures of one trial window (missing metrics are left out)."""
    out: dict[str, float] = {}
    for label, name in (("ttft", TTFT), ("itl", ITL), ("e2e", E2E), ("queue", QUEUE)):
        buckets = histogram_delta(before, after, name)
        for q in (0.5, 0.9, 0.99):
            value = histogram_quantile(q, buckets)
            if value is not None:
                out[f"server_{label}_p{round(q * 100)}"] = value
    for label, name in (("requests", "vllm:request_success"), ("preemptions", "vllm:num_preemptions"),
                        ("prompt_tokens", "vllm:prompt_tokens"),
                        ("generation_tokens", "vllm:generation_tokens")):
        value = counter_delta(before, after, name)
        if value is not None:
            out[f"server_{label}"] = value
    queries = counter_delta(before, after, "vllm:prefix_cache_queries")
    hits = counter_delta(before, after, "vllm:prefix_cache_hits")
    if queries and hits is not None:
        out["prefix_cache_hit_rate"] = hits / queries
    # of the prompt tokens looked up, those the KV tiers served (as the simulator reports)
    tiers_before, tiers_after = (snap.media.get(TIER_HITS, {}) for snap in (before, after))
    present = after.media.get(TIER_CAPACITY, {})   # the tiers the engine runs
    for medium, label in (("CPU", "host"), ("Disk", "disk")):
        if queries and medium in tiers_after and medium in present:
            out[f"{label}_tier_hit_rate"] = (
                tiers_after[medium] - tiers_before.get(medium, 0.0)) / queries
    out |= spec_decode_figures(counter_delta(before, after, SPEC_DRAFT_TOKENS),
                               counter_delta(before, after, SPEC_ACCEPTED_TOKENS))
    return out


def spec_decode_figures(draft: float | None, accepted: float | None) -> dict[str, float]:
    """Draft and accepted token counts of the window and their ratio, the acceptance rate
    (only when drafts were made: with speculation off there is no rate)."""
    if draft is None or accepted is None:
        return {}
    out = {"spec_draft_tokens": draft, "spec_accepted_tokens": accepted}
    if draft > 0:
        out["spec_acceptance_rate"] = accepted / draft
    return out


class GaugePoller:
    """Polls /metrics in a thread while the load runs: mean and max of the gauges
    (KV usage, running, waiting), which two scrapes alone cannot see."""

    def __init__(self, base_url: str, *, interval: float = 1.0) -> None:
        self._url, self._interval = base_url, interval
        self._stop = threading.Event()
        self._seen: dict[str, list[float]] = defaultdict(list)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "GaugePoller":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                snap = scrape(self._url, timeout=5)
            except (httpx.HTTPError, ValueError):
                continue
            for name in GAUGES:
                value = snap.value(name)
                if value is not None:
                    self._seen[name].append(value)

    def figures(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, values in self._seen.items():
            short = name.split(":", 1)[1]
            out[f"{short}_mean"] = sum(values) / len(values)
            out[f"{short}_max"] = max(values)
        return out


def wait_idle(base_url: str, *, timeout: float = 120.0, poll: float = 0.2) -> bool:
    """Wait until the server runs and queues nothing (its num_requests gauges at 0): a
    load that overran it leaves a backlog that would slow the next load down. False when
    it is still busy after `timeout` s, or has no gauges to tell."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            snap = scrape(base_url)
        except (httpx.HTTPError, ValueError):
            return False
        busy = [snap.value(name) for name in GAUGES[:2]]
        if None in busy:
            return False
        if sum(busy) == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
