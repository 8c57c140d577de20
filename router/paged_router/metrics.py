"""The router's own Prometheus metrics (`paged_router_*`), in a registry per app."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 1.0)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "paged_router_requests", "Requests sent to a backend, by the policy's decision "
            "(prefix_hit, hash, balance, overflow, session, least_load, round_robin, retry).",
            ["backend", "decision"], registry=r)
        self.retries = Counter(
            "paged_router_retries", "Requests retried on the next candidate, by what failed.",
            ["reason"], registry=r)
        self.failures = Counter(
            "paged_router_failed_requests", "Requests the router could not place on any "
            "backend (answered 502/503 itself).", ["reason"], registry=r)
        self.ejections = Counter(
            "paged_router_ejections", "Backends taken out of rotation until /health answers.",
            ["backend", "reason"], registry=r)
        self.held = Gauge(
            "paged_router_held_requests", "Requests waiting for a first backend "
            "(--cold-start-hold: a service scaled to zero while its first replica starts).",
            registry=r)
        self.backends = Gauge("paged_router_backends", "Known backends by state.", ["state"],
                              registry=r)
        self.in_flight = Gauge("paged_router_in_flight_requests",
                               "Requests the router has open on a backend.", ["backend"],
                               registry=r)
        self.prefix_queried = Counter(
            "paged_router_prefix_chunks_queried", "Prompt chunks looked up in the router's "
            "prefix table (prefix policy).", registry=r)
        self.prefix_hit = Counter(
            "paged_router_prefix_chunks_hit", "Prompt chunks the chosen backend had already "
            "been sent, by the router's table: its estimate of prefix-cache hits.", registry=r)
        self.hit_rate = Gauge("paged_router_estimated_prefix_hit_rate",
                              "prefix_chunks_hit / prefix_chunks_queried so far.", registry=r)
        self.overhead = Histogram(
            "paged_router_added_latency_seconds", "Time the router itself adds before the "
            "first response byte (parsing, hashing, routing, connecting; the backend's time "
            "excluded).",
            buckets=LATENCY_BUCKETS, registry=r)
        self.kv_events = Counter(
            "paged_router_kv_events", "KV events applied to the index (precise policy).",
            ["backend"], registry=r)
        self.kv_resyncs = Counter(
            "paged_router_kv_resyncs", "Times a backend's index was rebuilt: replay (a gap "
            "filled), snapshot (started late or the gap was gone), restart (its sequence "
            "began again).", ["backend", "how"], registry=r)
        self.kv_index_blocks = Gauge(
            "paged_router_kv_index_blocks", "Blocks each backend's prefix cache holds, by its "
            "KV events (precise policy).", ["backend"], registry=r)
        self._queried = self._hit = 0

    def prefix(self, queried: int, hit: int) -> None:
        self.prefix_queried.inc(queried)
        self.prefix_hit.inc(hit)
        self._queried += queried
        self._hit += hit
        if self._queried:
            self.hit_rate.set(self._hit / self._queried)
