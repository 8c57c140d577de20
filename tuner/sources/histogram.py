"""A workload fitted from a service's own Prometheus histograms (--workload-from-prometheus).

Over a window W (e.g. 24h) ending now, with `sel` the service's label matchers:

- prompt lengths: `sum by (le) (increase(vllm:request_prompt_tokens_bucket{sel}[W]))`;
- output lengths: the same over `vllm:request_generation_tokens_bucket`;
- arrival rate: `sum(increase(vllm:request_success_total{sel}[W])) / W`;
- observed prefix-cache hit rate (reported, not reproduced): hits / queries.

Resolution: vLLM's token buckets are 1, 2, 5, 10, 20, 50, ... (a factor 2-2.5 wide), so a
length is known only to lie in its bucket (lo, hi]. Sampling picks a bucket with its
observed frequency, then an integer uniformly in (lo, hi]: every bucket's share, and so
the CDF at every edge, is reproduced; the shape inside a bucket is assumed flat. The
overflow bucket (+Inf) is assumed to span (last edge, OVERFLOW_FACTOR x last edge].
Prompt and output lengths are drawn independently (the histograms are marginals) and
arrivals are Poisson at the mean rate (a counter gives no burstiness); no prefix is
shared. The fitted workload is written as a trace (loadtests/workloads/trace.py) and
replayed like a recorded one.
"""
from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass

from loadtests.workloads.trace import TraceRequest
from tuner.measure.promql import PrometheusReader

OVERFLOW_FACTOR = 2.0
_WINDOW = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> float:
    """'24h' -> 86400.0; ValueError naming the accepted form."""
    m = _WINDOW.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--window {text!r}: expected a positive duration like 500ms, 90s, 30m, "
                         "24h or 7d")
    return float(m.group(1)) * _UNIT[m.group(2)]


@dataclass(frozen=True)
class BucketDistribution:
    """Counts per histogram bucket: bucket i spans (edges[i-1], edges[i]] (edges[-1] is
    the assumed end of the overflow bucket); lengths are whole tokens."""

    edges: tuple[float, ...]
    counts: tuple[float, ...]

    @classmethod
    def from_cumulative(cls, pairs: list[tuple[float, float]], *, name: str
                        ) -> "BucketDistribution":
        """From Prometheus `le` buckets [(le, cumulative count)], +Inf included."""
        pairs = sorted(pairs)
        if not pairs or not math.isinf(pairs[-1][0]):
            raise ValueError(f"{name}: no histogram buckets with le=\"+Inf\" in the window; "
                             "does the selector match the service's engines?")
        finite = [le for le, _ in pairs[:-1]]
        last = finite[-1] if finite else 1.0
        edges = (*finite, max(last * OVERFLOW_FACTOR, last + 1))
        counts, before = [], 0.0
        for _, cumulative in pairs:
            cumulative = max(before, cumulative)  # increase() per bucket may wobble
            counts.append(cumulative - before)
            before = cumulative
        if before <= 0:
            raise ValueError(f"{name}: no requests observed in the window; choose a longer "
                             "--window or check the selector")
        return cls(edges=tuple(edges), counts=tuple(counts))

    @property
    def total(self) -> float:
        return sum(self.counts)

    def sample(self, rng: random.Random) -> int:
        i = rng.choices(range(len(self.counts)), weights=self.counts)[0]
        lo = math.floor(self.edges[i - 1]) if i else 0
        return rng.randint(lo + 1, max(lo + 1, math.floor(self.edges[i])))

    def cdf(self, value: float) -> float:
        """Share of requests with length <= value, exact at the bucket edges."""
        below = sum(c for c, e in zip(self.counts, self.edges) if e <= value)
        return below / self.total

    def describe(self) -> str:
        shares = [f"<={e:g}: {c / self.total:.0%}" for e, c in zip(self.edges, self.counts)
                  if c > 0]
        return ", ".join(shares)


@dataclass(frozen=True)
class FittedWorkload:
    prompt: BucketDistribution
    output: BucketDistribution
    rate: float                 # requests/s over the window
    requests: float             # requests counted in the window
    window_s: float
    source: str                 # Prometheus URL and selector
    prefix_hit_rate: float | None = None

    def synthesize(self, duration: float, *, seed: int = 0) -> list[TraceRequest]:
        """A trace of `duration` seconds: Poisson arrivals, independent lengths."""
        rng = random.Random(seed)
        out, t = [], rng.expovariate(self.rate)
        while t < duration:
            out.append(TraceRequest(timestamp=round(t, 4), prompt_tokens=self.prompt.sample(rng),
                                    output_tokens=max(1, self.output.sample(rng))))
            t += rng.expovariate(self.rate)
        if not out:
            raise ValueError(f"a rate of {self.rate:.4f} req/s yields no request in "
                             f"{duration:.0f} s; raise --duration or the rate (--rate)")
        return out

    def document(self) -> dict:
        hit = (f"; observed prefix-cache hit rate {self.prefix_hit_rate:.1%} (not reproduced)"
               if self.prefix_hit_rate is not None else "")
        return {"source": self.source, "inferred": [
            f"{self.requests:.0f} requests in the {self.window_s / 3600:g} h window: mean "
            f"arrival rate {self.rate:.4f} req/s{hit}",
            f"prompt tokens by bucket: {self.prompt.describe()}",
            f"output tokens by bucket: {self.output.describe()}",
        ], "assumed": [
            "lengths are known to their histogram bucket (edges 1, 2, 5, 10, 20, 50, ...: a "
            "factor 2-2.5); within a bucket they are drawn uniformly",
            f"the overflow bucket spans up to {OVERFLOW_FACTOR:g}x the last finite edge",
            "prompt and output lengths are independent (the histograms are marginals)",
            "arrivals are Poisson at the mean rate (the counter gives no burstiness)",
            "no prefix is shared between requests; prompt content is random token ids",
        ]}


def fit_from_prometheus(reader: PrometheusReader, *, selector: str = "",
                        window: str = "24h", at: float | None = None) -> FittedWorkload:
    """Query the histograms and counters over `window` ending at `at` (default now)."""
    seconds, at = parse_window(window), at if at is not None else time.time()
    sel, w = "{" + selector + "}", f"[{window.strip()}]"

    def buckets(metric: str) -> list[tuple[float, float]]:
        result = reader.query(f"sum by (le) (increase({metric}_bucket{sel}{w}))", at=at)
        return [(float(labels["le"]), value) for labels, value in result]

    prompt = BucketDistribution.from_cumulative(buckets("vllm:request_prompt_tokens"),
                                                name="vllm:request_prompt_tokens")
    output = BucketDistribution.from_cumulative(buckets("vllm:request_generation_tokens"),
                                                name="vllm:request_generation_tokens")
    requests = reader.scalar(f"sum(increase(vllm:request_success_total{sel}{w}))", at=at)
    if not requests:
        requests = prompt.total  # no counter: the histogram's own count
    hits = reader.scalar(f"sum(increase(vllm:prefix_cache_hits_total{sel}{w}))", at=at)
    queries = reader.scalar(f"sum(increase(vllm:prefix_cache_queries_total{sel}{w}))", at=at)
    return FittedWorkload(prompt=prompt, output=output, rate=requests / seconds,
                          requests=requests, window_s=seconds,
                          source=f"Prometheus {reader.url} {sel} over {window.strip()}",
                          prefix_hit_rate=hits / queries if queries else None)
