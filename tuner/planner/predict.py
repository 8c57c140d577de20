"""One replica's SLO capacity at the service's current mix, from the profile and simulator.

The mix is the workload fitted from the service's own histograms over the planner's window
(tuner/sources/histogram.py: prompt and output lengths by bucket); a trace of it runs
through the simulated engine (the engine's own scheduler, tuner/sim) with the service's
settings: its capacity by bisection on rate, and the median inter-token latency at the
rate each replica receives now (what the planner's correction compares with the observed
one). A mix is simulated once: predictions are remembered by the mix's bucket shares,
rounded to MIX_RESOLUTION.
"""
from __future__ import annotations

import dataclasses

from tuner.planner.core import Prediction
from tuner.sim.context import SimContext
from tuner.sources.histogram import FittedWorkload

MIX_RESOLUTION = 0.05      # bucket shares rounded to 5 %: a mix that moves less is the same
TRACE_REQUESTS = 400       # requests in the simulated trace of a mix


def mix_key(fitted: FittedWorkload) -> tuple:
    def shares(d):
        return d.edges, tuple(round(c / d.total / MIX_RESOLUTION) for c in d.counts)
    return shares(fitted.prompt), shares(fitted.output)


class SimPredictor:
    def __init__(self, ctx: SimContext, settings: dict) -> None:
        """`ctx`: a SimContext whose profile and SLOs are the service's (its trace is set
        per mix); `settings`: the service's engine settings."""
        self.ctx, self.settings = ctx, settings
        self._capacity: dict[tuple, float] = {}

    def __call__(self, fitted: FittedWorkload, per_replica_rate: float) -> Prediction:
        # the mix, not the rate, decides the capacity: synthesise enough requests of it
        nominal = dataclasses.replace(fitted, rate=max(fitted.rate, 1.0))
        trace = nominal.synthesize(TRACE_REQUESTS / nominal.rate, seed=0)
        ctx = dataclasses.replace(self.ctx, trace=trace, workload=None, _loaded=self.ctx._loaded)
        key = mix_key(fitted)
        if key not in self._capacity:
            result = ctx.capacity(self.settings)
            self._capacity[key] = result.rate
        itl = None
        if per_replica_rate > 0:
            itl = ctx.run(self.settings, per_replica_rate).figures.get("itl_p50")
        return Prediction(capacity=self._capacity[key], itl_p50=itl)
