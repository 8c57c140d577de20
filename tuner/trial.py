"""One measurement: (start an engine,) warm it, load it, score it from both sides.

Figures of a trial (all floats, stored as Optuna user attributes):
- client side, from the raw Locust samples (tuner.scoring): goodput, throughput,
  output_tokens_per_s, slo_attainment, ttft/tpot/itl/e2e p50/p90/p99, request counts;
- server side, from /metrics scraped before and after the load (tuner.metrics):
  server_ttft/itl/e2e/queue p50/p90/p99, prefix_cache_hit_rate, server_preemptions,
  token counters; and from polling during the load: kv_cache_usage_perc_mean/max,
  num_requests_running/waiting mean/max.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from tuner import metrics
from tuner.engine_proc import DEFAULT_ENGINE_CMD, EngineProcess, EngineStartError, failure_reason
from tuner.loadgen import LoadSpec, run_load
from tuner.scoring import load_samples, score


class Infeasible(RuntimeError):
    """These settings cannot serve (engine did not start, ran out of memory, died)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class EngineLaunch:
    """How to start an engine: command, model and flags every trial shares."""

    model: str | None = None
    engine_cmd: str = DEFAULT_ENGINE_CMD
    extra_flags: tuple[str, ...] = ()
    startup_timeout: float = 300.0
    env: tuple[tuple[str, str], ...] = ()


def warm_up(url: str, *, requests: int, model: str | None = None) -> None:
    """A few short non-streamed completions so lazy initialisation is not measured."""
    for _ in range(requests):
        body = {"prompt": "warm up the engine", "max_tokens": 4}
        if model:
            body["model"] = model
        try:
            response = httpx.post(url + "/v1/completions", json=body, timeout=120)
        except httpx.HTTPError as exc:
            raise Infeasible(f"warm-up request failed: {exc}") from None
        if response.status_code != 200:
            raise Infeasible(f"warm-up request got HTTP {response.status_code}: "
                             f"{response.text[:200]}")


def measure(url: str, load: LoadSpec, slos: dict, *, workdir: Path, warmup_requests: int = 2,
            on_progress: Callable[[float, float], bool] | None = None,
            progress_interval: float = 2.0) -> dict[str, float]:
    """Warm, scrape, run the load (polling gauges), scrape again; return the figures.

    `on_progress(elapsed_s, goodput_so_far)` may return True to stop early (pruning).
    """
    warm_up(url, requests=warmup_requests, model=load.model_name)
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
    figures = score(load_samples(samples_path), slos)
    if before is not None:
        try:
            figures.update(metrics.server_figures(before, metrics.scrape(url)))
        except (httpx.HTTPError, ValueError):
            pass
    figures.update(poller.figures())
    return figures


def run_trial(settings_flags: list[str], launch: EngineLaunch, load: LoadSpec, slos: dict, *,
              workdir: Path, warmup_requests: int = 2,
              on_progress: Callable[[float, float], bool] | None = None,
              progress_interval: float = 2.0) -> dict[str, float]:
    """Start an engine with the trial's flags, measure, stop it. Infeasible when it
    cannot start, fails its warm-up, or dies during the load."""
    engine = EngineProcess(flags=[*settings_flags, *launch.extra_flags], model=launch.model,
                           log_path=workdir / "engine.log", engine_cmd=launch.engine_cmd,
                           env=dict(launch.env))
    try:
        try:
            engine.start(timeout=launch.startup_timeout)
        except EngineStartError as exc:
            raise Infeasible(exc.reason) from None
        figures = measure(engine.url, load, slos, workdir=workdir,
                          warmup_requests=warmup_requests, on_progress=on_progress,
                          progress_interval=progress_interval)
        if not engine.alive():
            raise Infeasible("engine died during the load: "
                             + failure_reason(engine.log_text(), engine.returncode))
        return figures
    finally:
        engine.stop()
