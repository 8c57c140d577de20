"""A trial's server-side figures from a Prometheus (PromQL over its HTTP API).

`--prometheus URL` replaces the default path (scraping the engine's /metrics before and
after the load, tuner.measure.server_metrics) with queries over the trial's engine target and load
window, as a cluster's Prometheus would be read:

- quantiles: `histogram_quantile(q, sum by (le) (rate(<histogram>_bucket{sel}[W])))`;
- counters: `sum(increase(<counter>_total{sel}[W]))`;
- gauges: `sum(avg_over_time(...))` / `sum(max_over_time(...))` over the window.

The window W runs from the first scrape after the warm-up to the first scrape after the
load, evaluated at the latter's timestamp, so its edges sit on samples: `increase` hardly
extrapolates, and the warm-up never counts. `sel` selects the trial's engine: by default
`instance="HOST:PORT"` of its URL (Prometheus's own label for a scraped target, in a
cluster the pod's IP and port); `--prometheus-selector` gives another label matcher,
where `{instance}` is replaced by HOST:PORT. Prometheus must scrape the engine: in a
cluster the PodMonitor does it; locally `--prometheus-targets-dir` writes each trial's
engine into a file_sd folder that Prometheus watches.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tuner.measure.loadgen import LoadError
from tuner.measure.server_metrics import (E2E, GAUGES, ITL, QUEUE, SPEC_ACCEPTED_TOKENS,
                                          SPEC_DRAFT_TOKENS, TTFT, spec_decode_figures)


class PrometheusError(LoadError):
    """Prometheus did not answer, refused a query, or never scraped the engine: a harness
    failure (the trial fails and the sweep goes on), not an infeasible setting."""


def write_target(targets_dir: Path, name: str, url: str | None,
                 labels: dict[str, str] | None = None) -> Path:
    """Prometheus file_sd: `[{"targets": [HOST:PORT], "labels": ...}]` written atomically
    as targets_dir/name.json; url=None removes the file."""
    targets_dir.mkdir(parents=True, exist_ok=True)
    path = targets_dir / f"{name}.json"
    if url is None:
        path.unlink(missing_ok=True)
        return path
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [urlsplit(url).netloc], "labels": labels or {}}]))
    os.replace(tmp, path)
    return path


class PrometheusReader:
    def __init__(self, url: str, *, selector: str = 'instance="{instance}"',
                 timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.selector = selector
        self.timeout = timeout

    def selector_for(self, engine_url: str) -> str:
        return "{" + self.selector.replace("{instance}", urlsplit(engine_url).netloc) + "}"

    def query(self, expr: str, *, at: float) -> list[tuple[dict, float]]:
        """An instant query at time `at`: [(labels, value), ...]; PrometheusError."""
        try:
            response = httpx.get(self.url + "/api/v1/query",
                                 params={"query": expr, "time": f"{at:.3f}"}, timeout=30)
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} did not answer: {exc}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"query {expr!r} failed: {body.get('error', body)}")
        return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]

    def scalar(self, expr: str, *, at: float) -> float | None:
        result = self.query(expr, at=at)
        value = result[0][1] if result else None
        return None if value is None or math.isnan(value) else value

    def wait_for_scrape(self, sel: str, *, after: float) -> float:
        """The timestamp of the engine's first successful scrape later than `after`
        (waiting for it). A failed scrape (up 0: a timeout on a loaded machine) holds none
        of the engine's series, so it does not count."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            now = time.time()
            # timestamp() of the last `up` sample is the time of the target's last scrape
            # (of a bare selector only: of `up == 1` it is the evaluation time)
            value = self.scalar(f"max(timestamp(up{sel}) and up{sel} == 1)", at=now)
            if value is not None and value > after:
                return value
            time.sleep(0.2)
        raise PrometheusError(f"Prometheus at {self.url} has not scraped {sel} within "
                              f"{self.timeout:.0f} s: is the engine among its targets?")

    def figures(self, sel: str, start: float, end: float) -> dict[str, float]:
        """Server figures (the keys of tuner.measure.server_metrics.server_figures and GaugePoller) over
        the window (start, end] of scrape timestamps."""
        window = f"[{max(1, math.ceil((end - start) * 1000) + 1)}ms]"
        out: dict[str, float] = {}
        for label, name in (("ttft", TTFT), ("itl", ITL), ("e2e", E2E), ("queue", QUEUE)):
            for q in (0.5, 0.9, 0.99):
                value = self.scalar(f"histogram_quantile({q}, sum by (le) "
                                    f"(rate({name}_bucket{sel}{window})))", at=end)
                if value is not None and math.isfinite(value):
                    out[f"server_{label}_p{round(q * 100)}"] = value
        counters = {"requests": "vllm:request_success", "preemptions": "vllm:num_preemptions",
                    "prompt_tokens": "vllm:prompt_tokens",
                    "generation_tokens": "vllm:generation_tokens",
                    "queries": "vllm:prefix_cache_queries", "hits": "vllm:prefix_cache_hits",
                    "draft": SPEC_DRAFT_TOKENS, "accepted": SPEC_ACCEPTED_TOKENS}
        seen = {}
        for label, name in counters.items():
            value = self.scalar(f"sum(increase({name}_total{sel}{window}))", at=end)
            if value is not None:
                seen[label] = value
        for label in ("requests", "preemptions", "prompt_tokens", "generation_tokens"):
            if label in seen:
                out[f"server_{label}"] = seen[label]
        if seen.get("queries") and "hits" in seen:
            out["prefix_cache_hit_rate"] = seen["hits"] / seen["queries"]
        out |= spec_decode_figures(seen.get("draft"), seen.get("accepted"))
        for name in GAUGES:
            short = name.split(":", 1)[1]
            for stat in ("avg", "max"):
                # one series per engine (its model_name): the sum only drops labels
                value = self.scalar(f"sum({stat}_over_time({name}{sel}{window}))", at=end)
                if value is not None:
                    out[f"{short}_{'mean' if stat == 'avg' else 'max'}"] = value
        return out
