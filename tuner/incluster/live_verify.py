"""Verifying an applied setting on the live service's own traffic, with PromQL.

With spec.prometheus.url, `apply.mode: Auto` reads the target's engines (all its pods:
`namespace="NS",pod=~"TARGET-<hash>-<id>"`) over a window W (spec.apply.verifyWindow)
twice, with the same queries: the W before the patch (the baseline) and the W after the
rollout (its window starts at the first scrape once Prometheus scrapes the new pods only:
old pods may serve while they terminate, and Prometheus learns of a new pod a scrape or
two after the API does, so "one template" alone can still be the old one: when the patch
changes the pod template, the template the baseline's pods ran is not taken). Per
window:

- requests: `sum(increase(vllm:request_success_total{sel}[W]))`, rate = requests / W;
- per SLO metric, the share of observations within the SLO, interpolated in the
  histogram's buckets as histogram_quantile does (`sum by (le) (increase(X_bucket[W]))`):
  TTFT per request, the inter-token gaps (not a request's mean) for the ITL SLO, E2E per
  request; for the live traffic's unknown request kinds the tightest limit of each;
- attainment = the lowest of those shares (the share of requests meeting every SLO is at
  most that), goodput = rate x attainment (requests/s within the SLOs, estimated), and
  the p50/p99 of TTFT and ITL from the same buckets, for the record.

The gain held when the goodput after is positive and at least the baseline's. Both
windows must hold MIN_REQUESTS completed requests; with fewer ("no traffic"), the caller
verifies with a short load instead, as without Prometheus. The comparison assumes the
traffic is alike in both windows: a longer window evens it out, and a drop in the traffic
itself reads as a drop in goodput (a rollback: the cautious side).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable

from tuner.measure.server_metrics import E2E, ITL, TTFT, histogram_quantile
from tuner.measure.promql import PrometheusError, PrometheusReader

MIN_REQUESTS = 20
# SLO key (tuner.measure.scoring) -> the histogram its share is read from
SLO_HISTOGRAMS = {"ttft": TTFT, "tpot": ITL, "e2e": E2E}


def target_selector(namespace: str, target: str) -> str:
    """Label matchers of the target's own pods (a Deployment's `TARGET-<hash>-<id>`; trial
    services, `TUNING-t0-...`, are other names)."""
    return f'namespace="{namespace}",pod=~"{target}-[^-]+-[^-]+"'


def share_within(buckets: list[tuple[float, float]], limit: float) -> float | None:
    """The share of a histogram's observations at most `limit`, from cumulative (le, count)
    pairs ending at +Inf, linear within a bucket; None when it is empty."""
    if not buckets or buckets[-1][0] != math.inf or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if le >= limit:
            if math.isinf(le):
                within = prev_count
            else:
                within = prev_count + (count - prev_count) * (limit - prev_le) / (le - prev_le)
            return min(1.0, max(0.0, within / total))
        prev_le, prev_count = le, count
    return 1.0


def slo_limits(slos: dict[str, dict[str, float]]) -> dict[str, float]:
    """The tightest limit per SLO metric over the workload's request kinds."""
    limits: dict[str, float] = {}
    for per_kind in slos.values():
        for name, limit in per_kind.items():
            if name in SLO_HISTOGRAMS:
                limits[name] = min(limit, limits.get(name, math.inf))
    return limits


def figures_from(requests: float, buckets: dict[str, list[tuple[float, float]]],
                 limits: dict[str, float], window: float) -> dict[str, Any]:
    """One window's figures from its request count and its histograms' buckets."""
    shares = {}
    for name, limit in limits.items():
        share = share_within(buckets.get(SLO_HISTOGRAMS[name], []), limit)
        if share is not None:
            shares[name] = round(share, 4)
    attainment = min(shares.values()) if shares else (1.0 if requests > 0 else 0.0)
    rate = requests / window
    out: dict[str, Any] = {"requests": round(requests, 1), "rate": round(rate, 4),
                           "attainment": round(attainment, 4), "shares": shares,
                           "goodput": round(rate * attainment, 4)}
    for label, name in (("ttft", TTFT), ("itl", ITL)):
        for q in (0.5, 0.99):
            value = histogram_quantile(q, buckets.get(name, []))
            if value is not None and math.isfinite(value):
                out[f"{label}P{round(q * 100)}"] = round(value, 4)
    return out


def read_window(reader: PrometheusReader, sel: str, *, end: float, window: float,
                limits: dict[str, float]) -> dict[str, Any]:
    """The figures of the window (end - window, end] (PrometheusError when it fails)."""
    rng = f"[{max(1, round(window * 1000))}ms]"
    requests = reader.scalar(f"sum(increase(vllm:request_success_total{{{sel}}}{rng}))",
                             at=end) or 0.0
    buckets = {}
    for name in {*(SLO_HISTOGRAMS[k] for k in limits), TTFT, ITL}:
        rows = reader.query(f"sum by (le) (increase({name}_bucket{{{sel}}}{rng}))", at=end)
        buckets[name] = sorted((float(labels["le"]), value) for labels, value in rows
                               if "le" in labels and not math.isnan(value))
    return {**figures_from(requests, buckets, limits, window), "end": round(end, 3)}


def scraped_pods(reader: PrometheusReader, braced: str) -> set[str]:
    """The pods Prometheus scrapes now (`up == 1`)."""
    return {labels.get("pod", "") for labels, _ in reader.query(f"up{braced} == 1",
                                                                  at=time.time())}


def baseline(reader: PrometheusReader, sel: str, *, window: float,
             limits: dict[str, float]) -> dict[str, Any]:
    """The window up to the latest scrape of the live pods, before the patch; `pods`:
    those scraped then (the templates the window after must not read again)."""
    braced = "{" + sel + "}"
    end = reader.wait_for_scrape(braced, after=time.time())
    return {**read_window(reader, sel, end=end, window=window, limits=limits),
            "pods": sorted(scraped_pods(reader, braced))}


def template(pod: str) -> str:
    """A Deployment's pod `TARGET-<template hash>-<id>`: `TARGET-<template hash>`."""
    return pod.rsplit("-", 1)[0]


def one_template(pods: set[str]) -> bool:
    """Whether the pods (`TARGET-<template hash>-<id>`) are all of one pod template."""
    return len({template(pod) for pod in pods}) == 1


def wait_for_new_pods_only(reader: PrometheusReader, braced: str, *, timeout: float,
                           old: Iterable[str] = (),
                           sleep: Callable[[float], Any] = time.sleep) -> set[str]:
    """Until Prometheus scrapes the target's pods of one template only, and not a template
    of the `old` pods: a rollout's old pods can serve (and be scraped) while they
    terminate, after the service is Ready, and the new pods are scraped only once
    Prometheus has read them from service discovery."""
    old_templates = {template(pod) for pod in old}
    deadline = time.monotonic() + timeout
    while True:
        pods = scraped_pods(reader, braced)
        if pods and one_template(pods) and template(next(iter(pods))) not in old_templates:
            return pods
        if time.monotonic() > deadline:
            raise PrometheusError(f"Prometheus still scrapes the pods {sorted(pods)} "
                                  f"{timeout:.0f} s after the rollout: not one new template")
        sleep(0.5)


def after_rollout(reader: PrometheusReader, sel: str, *, window: float,
                  limits: dict[str, float], settle_timeout: float = 600.0,
                  old_pods: Iterable[str] = (),
                  sleep: Callable[[float], Any] = time.sleep) -> dict[str, Any]:
    """The window starting at the first scrape once only the new pods are scraped (call
    it after the rollout); `old_pods`: the pods before a patch that changed the pod
    template (none when it did not: the same template serves on)."""
    braced = "{" + sel + "}"
    pods = wait_for_new_pods_only(reader, braced, timeout=settle_timeout, old=old_pods,
                                  sleep=sleep)
    start = reader.wait_for_scrape(braced, after=time.time())
    sleep(max(0.0, start + window - time.time()))
    end = reader.wait_for_scrape(braced, after=start + window)
    return {**read_window(reader, sel, end=end, window=window, limits=limits),
            "pods": sorted(pods)}


def verdict(before: dict[str, Any], after: dict[str, Any] | None, *,
            min_requests: float = MIN_REQUESTS) -> tuple[bool | None, str]:
    """(held, why); held None: too little traffic in a window, verify with a load."""
    if before["requests"] < min_requests:
        return None, (f"{before['requests']:g} requests in the window before the apply, "
                      f"fewer than {min_requests:g}")
    if after is None:
        return None, "no window after the apply"
    if after["requests"] < min_requests:
        return None, (f"{after['requests']:g} requests in the window after the apply, "
                      f"fewer than {min_requests:g}")
    held = after["goodput"] > 0 and after["goodput"] >= before["goodput"]
    why = (f"live goodput {after['goodput']:.3f} req/s ({after['requests']:g} requests, "
           f"attainment {after['attainment']:.2f}) vs {before['goodput']:.3f} before the apply "
           f"({before['requests']:g} requests, attainment {before['attainment']:.2f})")
    return held, why
