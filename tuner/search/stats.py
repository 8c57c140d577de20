"""Gains over the baseline with 95 % intervals, and the decision they support.

Method (stated, since the rounds are few): in round r the baseline and every candidate
are measured back to back (interleaved, fresh engine processes, the same request stream
within a round, a new one per round). Each round gives a paired log ratio
d_r = ln(goodput_candidate_r / goodput_baseline_r); the gain is exp(mean d) (the geometric
mean of the per-round ratios) and its interval exp(mean d +- t(0.975, R-1) * sd(d) / sqrt(R)),
Student's t on the paired log ratios. Pairing removes what a round shares (machine load,
request stream); the log makes multiplicative noise additive. With multiplicative
log-normal noise this interval covers the true ratio 95 % of the time even for R = 3,
where a percentile bootstrap over 3 rounds covers far less (it can only resample 3
values), so the bootstrap is not used. A goodput of 0 (nothing met the SLOs) is floored
at half a request per load window so the ratio stays finite.

Decision: the winner is the candidate with the highest lower bound; when no lower bound
exceeds `min_gain` (1 by default) there is "no significant gain over the baseline" and
the baseline stays.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Student's t, two-sided 95 % (0.975 quantile), for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion, error < 1e-3 beyond 30 df
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True)
class Gain:
    """A candidate's goodput over the baseline's: point estimate and 95 % interval."""

    ratio: float
    low: float
    high: float
    rounds: int

    def text(self) -> str:
        return f"{self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def paired_gain(baseline: list[float], candidate: list[float], *, floor: float) -> Gain:
    """Gain of `candidate` over `baseline` from paired per-round goodputs (see module doc).
    With one round the interval is unbounded (nothing to estimate the noise from)."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError("paired_gain needs the same, non-zero number of rounds for both")
    if floor <= 0:
        raise ValueError(f"floor must be positive, got {floor}")
    diffs = [math.log(max(c, floor) / max(b, floor)) for b, c in zip(baseline, candidate)]
    n = len(diffs)
    mean = statistics.fmean(diffs)
    if n < 2:
        return Gain(math.exp(mean), 0.0, math.inf, n)
    half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return Gain(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


@dataclass(frozen=True)
class Decision:
    winner: str | None       # a candidate label, or None: keep the baseline
    reason: str


def decide(gains: dict[str, Gain | None], *, min_gain: float = 1.0) -> Decision:
    """The candidate with the highest lower bound, if that bound exceeds `min_gain`.
    A None gain marks a disqualified candidate (it failed to serve in some round)."""
    ranked = sorted(((g.low, label) for label, g in gains.items() if g is not None), reverse=True)
    if ranked and ranked[0][0] > min_gain:
        label = ranked[0][1]
        return Decision(label, f"{label}: gain {gains[label].text()}, lower bound above "
                               f"{min_gain:g}")
    best = (f"; best lower bound {ranked[0][0]:.2f} ({ranked[0][1]})" if ranked else "")
    return Decision(None, f"no significant gain over the baseline{best}")
