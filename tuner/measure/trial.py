"""One measurement of a running server: warm it, load it, score it from both sides.

The runners (tuner/measure/local.py, tuner/incluster/service_runner.py) start the server.

Figures of a trial (all floats, stored as Optuna user attributes):
- client side, from the raw Locust samples (tuner.measure.scoring): goodput, throughput,
  output_tokens_per_s, slo_attainment, ttft/tpot/itl/e2e p50/p90/p99, request counts;
- server side, from /metrics scraped before and after the load (tuner.measure.server_metrics):
  server_ttft/itl/e2e/queue p50/p90/p99, prefix_cache_hit_rate, server_preemptions,
  token counters; and from polling during the load: kv_cache_usage_perc_mean/max,
  num_requests_running/waiting mean/max.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable

import httpx

from tuner.measure import server_metrics as metrics
from tuner.measure.loadgen import LoadSpec, run_load
from tuner.measure.promql import PrometheusReader
from tuner.measure.runner import Infeasible
from tuner.measure.scoring import load_samples, score


_DEVICE = re.compile(r"loaded and warmed in [\d.]+ ?s \(\d+ KV blocks, (.+)\)\s*$", re.M)


def engine_device(log_text: str) -> str | None:
    """'cpu, 2 torch threads' or 'cuda:0', from the engine's 'loaded' log line."""
    found = _DEVICE.findall(log_text)
    return found[-1].strip() if found else None


def warm_up(url: str, *, requests: int, model: str | None = None) -> None:
    """A few short non-streamed completions so lazy initialisation is not measured."""
    for _ in range(requests):
        body = {"prompt": "warm up the engine", "max_tokens": 4}
        if model:
            body["model"] = model
        try:
            key = os.environ.get("PAGED_API_KEY")   # as the load sends it (loadtests.common)
            response = httpx.post(url + "/v1/completions", json=body, timeout=120,
                                  headers={"Authorization": f"Bearer {key}"} if key else None)
        except httpx.HTTPError as exc:
            raise Infeasible(f"warm-up request failed: {exc}") from None
        if response.status_code != 200:
            raise Infeasible(f"warm-up request got HTTP {response.status_code}: "
                             f"{response.text[:200]}")


def measure(url: str, load: LoadSpec, slos: dict, *, workdir: Path, warmup_requests: int = 2,
            on_progress: Callable[[float, float], bool] | None = None,
            progress_interval: float = 2.0,
            prometheus: PrometheusReader | None = None) -> dict[str, float]:
    """Warm, scrape, run the load (polling gauges), scrape again; return the figures.

    `on_progress(elapsed_s, goodput_so_far)` may return True to stop early (pruning).
    With `prometheus`, the server figures come from PromQL over the load window instead
    (tuner.measure.promql); the scrape path's quantiles are kept as `scrape_server_*` beside
    them, a check that the query selected the right engine.
    """
    warm_up(url, requests=warmup_requests, model=load.model_name)
    if prometheus is not None:
        sel = prometheus.selector_for(url)
        window_start = prometheus.wait_for_scrape(sel, after=time.time())
    try:
        before = metrics.scrape(url)
    except (httpx.HTTPError, ValueError):
        before = None  # a server without /metrics: client figures only
    samples_path = workdir / "samples.jsonl"

    def progress(elapsed: float) -> bool:
        if on_progress is None:
            return False
        partial = load_samples(samples_path)
        if partial.start is None:
            return False
        return on_progress(elapsed, score(partial, slos, now=time.time())["goodput"])

    with metrics.GaugePoller(url) as poller:
        run_load(load, url=url, workdir=workdir, on_progress=progress,
                 progress_interval=progress_interval)
    load_end = time.time()
    samples = load_samples(samples_path)
    refused = [r for r in samples.records if not r.get("ok") and not
               str(r.get("error") or "").startswith(("unfinished", "dropped"))]
    if refused and not any(r.get("ok") for r in samples.records) and \
            2 * len(refused) > len(samples.records):
        # nothing was served and most requests got an error: a setting (or a workload) the
        # server refuses, e.g. prompts longer than its max_model_len, is a failed trial with
        # the server's reason, not a measured goodput of 0. (A server merely too slow for
        # any request to finish in the window still scores 0: its requests are unfinished.)
        raise Infeasible(f"every request failed ({len(refused)} of "
                         f"{len(samples.records)} with an error): {refused[0].get('error')}")
    figures = score(samples, slos)
    server: dict[str, float] = {}
    if before is not None:
        try:
            server = metrics.server_figures(before, metrics.scrape(url))
        except (httpx.HTTPError, ValueError):
            pass
    if prometheus is None:
        figures.update(server)
        figures.update(poller.figures())
    else:
        figures.update({f"scrape_{k}": v for k, v in server.items() if k.endswith(("0", "9"))})
        figures.update(prometheus.figures(sel, window_start,
                                          prometheus.wait_for_scrape(sel, after=load_end)))
    return figures
