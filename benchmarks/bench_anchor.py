"""How often does the anchor (tuner/search/capacity_profile.anchor_time) bring the
baseline's simulated capacity within its tolerance of the pilot's real one? On synthetic
capacity-against-step-time curves of the three shapes the simulator gives, each with a
deterministic pseudo-noise per factor (a capacity search reads its knee a little high or
low at each factor):

- power: capacity ~ factor^-k, k in 0.5-1.2 (batching engines, pool-bound in part);
- steep: one sequence whose service time nears the 1.5-s TTFT SLO, capacity
  rho / service with rho = 1 - (service / 1.5)^1.5;
- cliff: capacity ~ 1/factor, 3x lower past a factor (a queue verdict that flips).

The peer is the secant the anchor used before 2026-12-07 (through the last two pairs,
4 steps at most, stopping on a step against the trend), run on the same curves.

    python -m benchmarks.bench_anchor [--curves 400]
"""
from __future__ import annotations

import argparse
import hashlib
import math
import random
from types import SimpleNamespace

from tuner.search import capacity_profile

TOLERANCE = capacity_profile.ANCHOR_TOLERANCE


def _noise(factor: float, seed: int) -> float:
    """A fixed draw in [-1, 1] per (curve, factor to 3 decimals of its log)."""
    digest = hashlib.sha256(f"{seed}:{round(math.log(factor), 3)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2 ** 32 * 2 - 1


def curve(kind: str, seed: int, noise: float):
    """(capacity(factor), the pilot's real capacity) of one synthetic curve."""
    rnd = random.Random(seed)

    def noisy(f, value):
        return value * (1 + noise * _noise(f, seed))
    if kind == "power":
        k = rnd.uniform(0.5, 1.2)
        return (lambda f: noisy(f, 5.0 / f ** k)), 5.0 * math.exp(rnd.uniform(-1, 1))
    if kind == "steep":
        service = rnd.uniform(0.3, 1.4)

        def steep(f):
            s = service * f
            return noisy(f, max(0.02, 1 - (s / 1.5) ** 1.5) / s)
        return steep, math.exp(rnd.uniform(-0.2, 1.0)) / service
    edge = math.exp(rnd.uniform(-1, 0.3))
    return ((lambda f: noisy(f, 5.0 / f * (1 if f < edge else 0.33))),
            5.0 / edge * math.exp(rnd.uniform(-0.5, 0.3)))


def secant(capacity, real: float, steps: int = 4) -> tuple[float, int]:
    """The former anchor: (the closest capacity tried, simulations)."""
    tried, slope = [(1.0, capacity(1.0))], 1.0
    while abs(tried[-1][1] - real) / real > TOLERANCE and len(tried) <= steps:
        factor, got = tried[-1]
        nxt = min(max(factor * math.exp(math.log(got / real) / slope),
                      capacity_profile.ANCHOR_RANGE[0]), capacity_profile.ANCHOR_RANGE[1])
        if nxt == factor:
            break
        tried.append((nxt, capacity(nxt)))
        slope = -math.log(tried[-1][1] / got) / math.log(nxt / factor)
        if slope < capacity_profile.ANCHOR_MIN_SLOPE:
            break
    return min((c for _, c in tried), key=lambda c: abs(c - real)), len(tried) - 1


def anchor(capacity, real: float) -> tuple[float, int]:
    """The anchor as the sweep runs it, on factors instead of profiles."""
    plan = SimpleNamespace(sim=SimpleNamespace(factor=1.0), log=lambda line: None,
                           anchor=None)
    scaled = capacity_profile.scaled
    capacity_profile.scaled = lambda sim, factor: SimpleNamespace(factor=factor)
    try:
        capacity_profile.anchor_time(plan, real=real, simulated=capacity(1.0),
                                     predict=lambda sim: capacity(sim.factor))
    finally:
        capacity_profile.scaled = scaled
    return plan.anchor["anchored"], plan.anchor["simulations"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curves", type=int, default=400, help="curves per shape and noise")
    args = parser.parse_args()
    print(f"| shape | noise | method | within {TOLERANCE:.0%} | within 33 % | "
          "median error | simulations (mean) |")
    print("|---|---|---|---|---|---|---|")
    for kind in ("power", "steep", "cliff"):
        for noise in (0.0, 0.2, 0.3):
            for name, method in (("secant (before)", secant), ("anchor", anchor)):
                errors, sims = [], []
                for seed in range(args.curves):
                    capacity, real = curve(kind, seed, noise)
                    got, n = method(capacity, real)
                    errors.append(abs(got - real) / real)
                    sims.append(n)
                errors.sort()
                share = [sum(e <= bound for e in errors) / len(errors) for bound in
                         (TOLERANCE + 1e-9, 0.33)]
                print(f"| {kind} | +-{noise:.0%} | {name} | {share[0]:.0%} | {share[1]:.0%} | "
                      f"{errors[len(errors) // 2]:.3f} | {sum(sims) / len(sims):.1f} |")


if __name__ == "__main__":
    main()
