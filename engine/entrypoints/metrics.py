"""Prometheus metrics under vLLM's names and types, plus the block pool under `paged:`.

One `CollectorRegistry` per server (several servers can share a test process). The
engine-loop thread feeds it after every step; `/metrics` only renders it.
Counters are declared without `_total`; prometheus_client appends it on exposition,
which gives vLLM's exposed names (`vllm:prompt_tokens_total`, ...).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine.step_shape import FIGURES as STEP_FIGURES

# Bucket edges as vLLM publishes them, so dashboards' quantile queries carry over.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
                0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


def token_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10 ** exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


@dataclass
class _Tracked:
    """What the metrics remember about one live request between steps."""
    num_tokens: int = 0
    last_token_time: float | None = None
    prompt_token_ids: list | None = None  # for the request log (aborts have no output)
    arrival_time: float | None = None


class ServerMetrics:
    def __init__(self, *, model_name: str, max_model_len: int,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        reg, lbl = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, lbl, registry=reg).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, lbl, registry=reg).labels(model_name)

        def hist(name: str, doc: str, buckets: Any) -> Any:
            return Histogram(name, doc, lbl, buckets=buckets, registry=reg).labels(model_name)

        tokens = token_buckets(max_model_len)
        self.num_requests_running = gauge("vllm:num_requests_running",
                                          "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting",
                                          "Number of requests waiting to be processed.")
        self.kv_cache_usage_perc = gauge("vllm:kv_cache_usage_perc",
                                         "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries",
                                            "Prefix cache queries, in terms of prompt tokens.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits",
                                         "Prefix cache hits, in terms of prompt tokens.")
        self.num_preemptions = counter("vllm:num_preemptions", "Cumulative preemptions.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
        self._request_success = Counter(
            "vllm:request_success", "Count of finished requests by finish reason.",
            ["model_name", "finished_reason"], registry=reg)
        for reason in FINISH_REASONS:  # expose zeros, so rate() works from the first scrape
            self._request_success.labels(model_name, reason)
        self.ttft = hist("vllm:time_to_first_token_seconds",
                         "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds",
                        "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds",
                        "Histogram of end-to-end request latency in seconds.",
                        REQUEST_LATENCY_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds",
                               "Histogram of time spent waiting in the queue in seconds.",
                               REQUEST_LATENCY_BUCKETS)
        self.inference_time = hist("vllm:request_inference_time_seconds",
                                   "Histogram of time spent running (prefill and decode).",
                                   REQUEST_LATENCY_BUCKETS)
        self.prefill_time = hist("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in prefill.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = hist("vllm:request_decode_time_seconds",
                                "Histogram of time spent in decode.", REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = hist("vllm:request_prompt_tokens",
                                          "Number of prefill tokens processed.", tokens)
        self.request_generation_tokens = hist("vllm:request_generation_tokens",
                                              "Number of generation tokens processed.", tokens)
        self.request_params_n = hist("vllm:request_params_n", "The n request parameter.",
                                     [1, 2, 5, 10, 20])
        self.request_params_max_tokens = hist("vllm:request_params_max_tokens",
                                              "The max_tokens request parameter.", tokens)
        # This engine's block pool, in blocks (vLLM exposes only the usage fraction).
        self.free_blocks = gauge("paged:num_free_blocks", "KV blocks never used or freed.")
        self.cached_blocks = gauge("paged:num_cached_blocks",
                                   "KV blocks unreferenced but kept for prefix-cache reuse.")
        self.used_blocks = gauge("paged:num_used_blocks", "KV blocks referenced by requests.")
        self.total_blocks = gauge("paged:num_blocks", "KV blocks allocated in the pool.")
        self.cow_copies = counter("paged:cow_copies", "Copy-on-write block copies.")
        self.evictions = counter("paged:evictions", "Cached blocks evicted for reuse.")
        # The server's own fault and back-pressure figures (the soak test reads them).
        self.engine_step_failures = counter(
            "paged:engine_step_failures", "Engine steps that raised (their requests got 500).")
        self.slow_reader_aborts = counter(
            "paged:slow_reader_aborts",
            "Streams aborted because the client fell behind by more than the backlog limit.")
        self.max_stream_backlog = gauge(
            "paged:max_stream_backlog_tokens",
            "Most generated tokens any request has had waiting for its client (since start).")
        # Speculative decoding, under vLLM's names (zero while it is off).
        self.spec_decode_num_drafts = counter("vllm:spec_decode_num_drafts",
                                              "Number of spec decoding drafts.")
        self.spec_decode_num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                                    "Number of draft tokens.")
        self.spec_decode_num_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens",
                                                       "Number of accepted tokens.")
        self._spec_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.", ["model_name", "position"], registry=reg)
        # The serving loop's steps: time and composition (engine/step_shape.py), so a
        # step-time profile can be fitted from a live service (tuner/sim/live_profile.py).
        self.step_duration = hist(
            "paged:engine_step_duration_seconds",
            "Serving-loop iterations that ran a step: schedule, model, sampling, outputs "
            "and their delivery to the streams, in seconds.", STEP_BUCKETS)
        self._step_shape = Counter(
            "paged:engine_step_shape", "Summed composition of the steps in "
            "paged:engine_step_duration_seconds, per figure of engine/step_shape.py.",
            ["model_name", "figure"], registry=reg)
        # What the loop spends between two steps while requests are unfinished (new
        # requests taken in, stats, the GIL shared with the HTTP side): a live profile adds
        # it to each step's time, since a simulated engine runs its steps back to back.
        self.step_gap = hist(
            "paged:engine_step_gap_seconds",
            "Serving-loop time between the end of one step and the start of the next while "
            "requests were unfinished (no idle wait), in seconds.", STEP_BUCKETS)
        self._step_figures = {name: self._step_shape.labels(model_name, name)
                              for name in STEP_FIGURES}
        self._max_backlog = 0
        self._last_totals: dict[str, int] = {}
        self._tracked: dict[str, _Tracked] = {}
        self.request_log: Any = None  # request_log.RequestLog (--request-log), or None

    def set_cache_config(self, *, block_size: int, num_gpu_blocks: int,
                         enable_prefix_caching: bool, gpu_memory_utilization: float) -> None:
        info = Gauge("vllm:cache_config_info", "Information of the KV cache configuration.",
                     ["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching",
                      "gpu_memory_utilization"], registry=self.registry)
        info.labels(self.model_name, str(block_size), str(num_gpu_blocks),
                    str(enable_prefix_caching), str(gpu_memory_utilization)).set(1)

    # --- fed by the engine-loop thread ---------------------------------------------------

    def observe_stats(self, stats: Any) -> None:
        """Gauges from the engine's current stats; counters from its cumulative totals."""
        self.num_requests_running.set(stats.num_requests_running)
        self.num_requests_waiting.set(stats.num_requests_waiting)
        self.kv_cache_usage_perc.set(stats.kv_cache_usage)
        self.free_blocks.set(stats.num_free_blocks)
        self.cached_blocks.set(stats.num_cached_blocks)
        self.used_blocks.set(stats.num_used_blocks)
        self.total_blocks.set(stats.num_blocks)
        counters = {"prefix_cache_queries": self.prefix_cache_queries,
                    "prefix_cache_hits": self.prefix_cache_hits, "evictions": self.evictions,
                    "cow_copies": self.cow_copies, "num_preemptions": self.num_preemptions}
        counters.update({"spec_num_drafts": self.spec_decode_num_drafts,
                         "spec_num_draft_tokens": self.spec_decode_num_draft_tokens,
                         "spec_num_accepted_tokens": self.spec_decode_num_accepted_tokens})
        totals = {key: getattr(stats, key, 0) for key in counters}
        for pos, total in enumerate(getattr(stats, "spec_num_accepted_tokens_per_pos", ())):
            counters[f"spec_pos_{pos}"] = self._spec_per_pos.labels(self.model_name, str(pos))
            totals[f"spec_pos_{pos}"] = total
        for key, total in totals.items():
            delta = total - self._last_totals.get(key, total)
            if delta > 0:
                counters[key].inc(delta)
            self._last_totals[key] = total

    def observe_step(self, shape: Any, seconds: float) -> None:
        """One serving-loop iteration that ran a step of this shape (a StepShape)."""
        self.step_duration.observe(seconds)
        for name, child in self._step_figures.items():
            value = getattr(shape, name)
            if value:
                child.inc(value)

    def observe_output(self, out: Any, params: Any) -> None:
        """Per-request figures from one step's (cumulative) RequestOutput."""
        tracked = self._tracked.setdefault(out.request_id, _Tracked())
        m = out.metrics
        if tracked.prompt_token_ids is None:
            tracked.prompt_token_ids, tracked.arrival_time = out.prompt_token_ids, m.arrival_time
        num_tokens = sum(len(c.token_ids) for c in out.outputs)
        new_tokens = num_tokens - tracked.num_tokens
        if new_tokens > 0:
            if tracked.num_tokens == 0:  # the prefill step
                self.prompt_tokens.inc(len(out.prompt_token_ids))
                if m.first_token_time is not None:
                    self.ttft.observe(m.first_token_time - m.arrival_time)
            elif tracked.last_token_time is not None and m.last_token_time is not None:
                self.itl.observe(m.last_token_time - tracked.last_token_time)
            self.generation_tokens.inc(new_tokens)
            tracked.num_tokens, tracked.last_token_time = num_tokens, m.last_token_time
        if out.finished:
            reason = next((c.finish_reason for c in out.outputs if c.finish_reason), "stop")
            self._finish(out, params, reason)

    def observe_backlog(self, tokens: int) -> None:
        """Event loop: tokens one request has produced and its client not yet taken."""
        if tokens > self._max_backlog:
            self._max_backlog = tokens
            self.max_stream_backlog.set(tokens)

    def observe_abort(self, request_id: str, params: Any) -> None:
        tracked = self._tracked.pop(request_id, None)
        self._request_success.labels(self.model_name, "abort").inc()
        self.request_generation_tokens.observe(tracked.num_tokens if tracked else 0)
        self._observe_params(params)
        if self.request_log is not None and tracked and tracked.prompt_token_ids is not None:
            self.request_log.record(arrival_monotonic=tracked.arrival_time,
                                    prompt_token_ids=tracked.prompt_token_ids,
                                    output_tokens=tracked.num_tokens, finish_reason="abort")

    def _finish(self, out: Any, params: Any, reason: str) -> None:
        tracked = self._tracked.pop(out.request_id, _Tracked())
        m = out.metrics
        finished = m.finished_time if m.finished_time is not None else time.monotonic()
        self._request_success.labels(self.model_name, reason).inc()
        self.e2e.observe(finished - m.arrival_time)
        if m.first_scheduled_time is not None:
            self.queue_time.observe(m.first_scheduled_time - m.arrival_time)
            self.inference_time.observe(finished - m.first_scheduled_time)
            if m.first_token_time is not None:
                self.prefill_time.observe(m.first_token_time - m.first_scheduled_time)
                self.decode_time.observe(finished - m.first_token_time)
        self.request_prompt_tokens.observe(len(out.prompt_token_ids))
        self.request_generation_tokens.observe(tracked.num_tokens)
        self._observe_params(params)
        if self.request_log is not None:
            self.request_log.record(arrival_monotonic=m.arrival_time,
                                    prompt_token_ids=out.prompt_token_ids,
                                    output_tokens=tracked.num_tokens, finish_reason=reason)

    def _observe_params(self, params: Any) -> None:
        self.request_params_n.observe(params.n)
        if params.max_tokens is not None:
            self.request_params_max_tokens.observe(params.max_tokens)
