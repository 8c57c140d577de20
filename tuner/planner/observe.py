"""What the service does now, from the Prometheus that scrapes it, and one planning step.

`observe` reads the window (at - window, at]: requests finished (vllm:request_success),
their mean prompt and output lengths, the prefix-cache hit rate and the median
inter-token latency (tuner/measure/promql.PrometheusReader.figures). The arrival rate is
the finished requests plus the growth of the requests inside the engines (running +
waiting, at the window's end less at its start) over the window: an overloaded service
finishes no more than it can serve, and sizing it from its completions alone would ask
for the replicas it has (benchmarks/bench_planner.py showed the planner climbing one
replica per interval through a 4x step that way). Without those gauges, the completions.

`Step` turns an observation into a decision: the mix's prediction (tuner/planner/
predict.py) only when requests arrived; an idle window reuses the last prediction (only
the idle rule decides then). Prometheus unreachable or without the service's series: the replicas stay.
"""
from __future__ import annotations

import math

from tuner.measure.promql import PrometheusError, PrometheusReader
from tuner.planner.core import Decision, Observation, Planner, Prediction
from tuner.sources.histogram import fit_from_prometheus


def observe(reader: PrometheusReader, selector: str, *, window: float, at: float,
            replicas: int) -> Observation:
    sel = "{" + selector + "}"
    figures = reader.figures(sel, at - window, at)
    if "server_requests" not in figures:
        raise PrometheusError(f"Prometheus at {reader.url} has no vllm:request_success for "
                              f"{sel} in the last {window:.0f} s: does it scrape the service?")
    requests = figures["server_requests"]
    before, after = in_system(reader, sel, at - window), in_system(reader, sel, at)
    waiting = reader.scalar(f"sum(vllm:num_requests_waiting{sel})", at=at)
    grown = after - before if before is not None and after is not None else 0.0

    def mean(name: str) -> float | None:
        return figures[name] / requests if requests and name in figures else None
    return Observation(at=at, rate=max(0.0, requests + grown) / window, replicas=replicas,
                       completed=requests / window, in_system=after, waiting=waiting,
                       itl_p50=figures.get("server_itl_p50"),
                       prompt_tokens=mean("server_prompt_tokens"),
                       output_tokens=mean("server_generation_tokens"),
                       hit_rate=figures.get("prefix_cache_hit_rate"))


def range_window(seconds: float) -> str:
    """A range selector's duration for a window of `seconds`, in whole milliseconds (one
    more, rounded up, as `observe`'s figures have it: the sample at the window's left edge
    counts). Prometheus takes no fractional duration: formatted with `:g`, a window between
    two scrape timestamps a millisecond off whole seconds (a loaded machine's late scrape)
    became "4.001s", a parse error, and the planner held (CI, 2026-12-06)."""
    return f"{math.ceil(seconds * 1000) + 1}ms"


def in_system(reader: PrometheusReader, sel: str, at: float) -> float | None:
    """Requests inside the service's engines at `at` (running + waiting), None when
    Prometheus has no running gauge for them."""
    running = reader.scalar(f"sum(vllm:num_requests_running{sel})", at=at)
    if running is None:
        return None
    waiting = reader.scalar(f"sum(vllm:num_requests_waiting{sel})", at=at)
    return running + (waiting or 0.0)


class Step:
    """The planner with its Prometheus, service selector and predictor (one per service)."""

    def __init__(self, planner: Planner, reader: PrometheusReader, selector: str, predictor,
                 *, window: float) -> None:
        self.planner, self.reader, self.selector = planner, reader, selector
        self.predictor, self.window = predictor, window
        self.last: Prediction | None = None

    def __call__(self, *, at: float, replicas: int) -> tuple[Decision, Observation | None]:
        try:
            obs = observe(self.reader, self.selector, window=self.window, at=at,
                          replicas=replicas)
            if obs.rate > 0:
                refresh = getattr(self.predictor, "refresh", None)
                if refresh is not None:   # a predictor that follows the service's steps
                    refresh(at)
                fitted = fit_from_prometheus(self.reader, selector=self.selector,
                                             window=range_window(self.window), at=at)
                self.last = self.predictor(fitted, obs.rate / max(1, replicas))
        except (PrometheusError, ValueError) as exc:
            return self.planner.hold(at, replicas, str(exc)), None
        pred = self.last or Prediction(capacity=math.inf)   # idle from the start
        return self.planner.decide(obs, pred), obs
