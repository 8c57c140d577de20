"""Client-side scoring of a trial from the raw samples Locust wrote.

Goodput (DistServe's sense): completed requests per second that met every SLO of their
kind, over the measurement window (the Locust run). A request that failed, was dropped,
or was still running when the window closed counts against nothing but also adds
nothing: it simply is not good. Per-request TPOT is DistServe's: the time from its first
to its last output token over the tokens after the first (`tpot`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Samples:
    """The parsed samples file: request records plus the run's start/stop markers."""

    records: list[dict] = field(default_factory=list)
    start: float | None = None
    stop: float | None = None


def load_samples(path: str | Path) -> Samples:
    """Read a samples file; a torn last line (the writer is still running) is skipped."""
    out = Samples()
    path = Path(path)
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        event = record.get("event")
        if event == "start":
            out.start = record["t"] if out.start is None else out.start
        elif event == "stop":
            out.stop = record["t"]
        else:
            out.records.append(record)
    return out


def tpot(record: dict) -> float:
    """Time per output token of one request: its streamed gaps' sum (first token to last)
    over its output tokens after the first (0 for a single-token reply). The gaps are
    between streamed chunks, and a chunk carries every token a step produced: one per step
    without speculation, up to 1 + k with k-token drafts, so the mean gap would be a time
    per step and would charge speculation for the tokens it adds (the agentic sweep of
    2026-12-05: a request of 7 tokens in 3 chunks read 0.35 s against its 0.115 s per
    token). Without a token count (a server that reports no usage) the chunks are the
    tokens."""
    gaps = record.get("itl") or []
    if not gaps:
        return 0.0
    after_first = max(int(record.get("output_tokens") or 0) - 1, len(gaps))
    return sum(gaps) / after_first


def meets_slo(record: dict, slo: dict[str, float]) -> bool:
    """True when the request succeeded and every threshold in `slo` holds."""
    if not record.get("ok"):
        return False
    measured = {"ttft": record.get("ttft"), "e2e": record.get("e2e"), "tpot": tpot(record)}
    return all(measured[name] is not None and measured[name] <= limit
               for name, limit in slo.items())


def quantile(values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile of raw values (numpy's default method)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def score(samples: Samples, slos: dict[str, dict[str, float]], *,
          window: float | None = None, now: float | None = None) -> dict[str, float]:
    """Client figures of a run. `window` (s) overrides the start/stop markers; `now`
    scores a run still in progress (window = now - start). Kinds without an SLO entry
    use no thresholds (success is enough)."""
    if window is None:
        end = samples.stop if samples.stop is not None else now
        if samples.start is None or end is None:
            raise ValueError("samples have no start/stop markers; pass window=")
        window = end - samples.start
    window = max(window, 1e-9)
    records = samples.records
    ok = [r for r in records if r.get("ok")]
    good = [r for r in records if meets_slo(r, slos.get(r.get("kind"), {}))]
    out = {
        "window_s": window,
        "requests": float(len(records)),
        "completed": float(len(ok)),
        "failed": float(len(records) - len(ok)),
        "slo_met": float(len(good)),
        "goodput": len(good) / window,
        "throughput": len(ok) / window,
        "output_tokens_per_s": sum(r.get("output_tokens", 0) for r in ok) / window,
        "slo_attainment": len(good) / len(records) if records else 0.0,
    }
    series = {"ttft": [r["ttft"] for r in ok if r.get("ttft") is not None],
              "e2e": [r["e2e"] for r in ok if r.get("e2e") is not None],
              "tpot": [tpot(r) for r in ok],
              "itl": [gap for r in ok for gap in r.get("itl") or []]}
    for name, values in series.items():
        for q in (0.5, 0.9, 0.99):
            value = quantile(values, q)
            if value is not None:
                out[f"{name}_p{round(q * 100)}"] = value
    return out
