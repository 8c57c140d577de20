"""The SLO planner's arithmetic (issue 38): from what the service does now to how many
replicas it needs, every interval, with the reason written down.

Every interval the planner gets an Observation (the arrival rate and mix over the last
window, the observed inter-token latency, the replicas running) and a Prediction for that
mix (one replica's SLO capacity from the profile and simulator, and the inter-token
latency the simulator expects at the observed per-replica rate). Then:

1. correction: how much slower (> 1) or faster the service's steps are than the
   profile's, from its observed inter-token latency, by time scaling: an engine whose
   steps all take s times longer serves rate r as the profiled one serves rate r s, with
   every time s times longer, so s solves s * itl(r s) = observed, itl(.) the simulator's
   median inter-token latency at a per-replica rate (`slowdown`). The plain ratio
   observed / itl(r) overstates s wherever itl rises with the rate (near capacity it read
   3.4 for a true 1.25 in bench_planner.py, and the fleet held 8 replicas for 4). Smoothed
   over intervals (CORRECTION_WEIGHT to the newest), within [1/4, 4], and learned only
   from a steady window (`steady`: no queue filling or draining); the corrected capacity is
   the predicted one divided by it, times the spec's utilisation (the margin below the SLO
   cliff, UTILISATION unless `targetUtilization` says; lower buys headroom for what no
   reactive scaler sees in time: a step or a burst shorter than a start-up);
2. forecast: the rate over the interval the replicas asked for now will serve
   (tuner/planner/forecast.py): `none` repeats the observed one, `holt` projects its trend
   1 + startup / interval intervals ahead (a replica asked for now serves after its
   start-up, until the decision after);
3. wanted = ceil((forecast + waiting / interval) / corrected capacity): the arrivals and
   the requests queued now, cleared within one interval (a fleet sized to its arrivals
   alone never drains a queue it built while scaling: bench_planner.py's replicas at 90 %
   of their capacity kept one for minutes); at least one while any request arrives;
   zero only when `min_replicas` is 0 and no request arrived for `idle_window` s (or
   none arrives while it is at zero already);
4. bounds: within [min_replicas, max_replicas];
5. stabilisation (the HPA's rule, on the arrivals): scaling up is immediate, scaling down
   goes only to the highest count the *arrivals* wanted (forecast / corrected capacity)
   over the last `scale_down_stabilization` s, so a dip does not shed replicas that the
   next minute needs again; a queue being cleared is transient by construction, so the
   replicas it asked for are not held (after a 4x step they held 7 replicas for a load of 3
   for a minute), nor are idle intervals' (the idle window is their own hold).
Without an observation (Prometheus unreachable, or no data) the replicas stay as they are
and the decision says why. At zero replicas, requests held by the router (`wake`) bring
the first replica back.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from tuner.planner.forecast import FORECASTS, Forecaster

CORRECTION_WEIGHT = 0.5
CORRECTION_BOUNDS = (0.25, 4.0)
STEADY_SHARE = 0.1   # arrivals within 10 % of completions: the window's gaps are the steps'
SLOWDOWN_STEPS = 6   # bisections of the slowdown's bracket (a factor 4 to within 2.2 %)
# Each replica is planned at this share of its SLO capacity. At the capacity itself a
# replica meets the SLOs for exactly the target share of requests, and attainment falls off
# a cliff just above it (bench_planner.py: the capacities at 90 % and 95 % attainment are
# the same 30.6 req/s), so a fleet planned at 100 % spends every ramp's intervals on the
# cliff's edge (attainment 0.69 with an exact correction).
UTILISATION = 0.9


@dataclass(frozen=True)
class PlannerSpec:
    min_replicas: int = 1
    max_replicas: int = 8
    target_attainment: float = 0.9
    interval: float = 30.0
    scale_down_stabilization: float = 300.0
    idle_window: float = 600.0
    forecast: str = "none"
    startup: float = 0.0       # s from a replica asked for to its serving (the forecast's lead)
    utilisation: float = UTILISATION   # the share of its SLO capacity a replica is planned at

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"minReplicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError(f"maxReplicas ({self.max_replicas}) must be >= 1 and >= "
                             f"minReplicas ({self.min_replicas})")
        if not 0 < self.target_attainment <= 1:
            raise ValueError(f"targetAttainment must be in (0, 1], got {self.target_attainment}")
        if self.interval <= 0 or self.scale_down_stabilization < 0 or self.idle_window < 0 \
                or self.startup < 0:
            raise ValueError("interval must be > 0; scaleDownStabilization, the idle window "
                             "and startupSeconds >= 0 (seconds)")
        if not 0 < self.utilisation <= 1:
            raise ValueError(f"targetUtilization must be in (0, 1], got {self.utilisation}")
        if self.forecast not in FORECASTS:
            raise ValueError(f"forecast {self.forecast!r}: expected one of {FORECASTS}")


@dataclass(frozen=True)
class Observation:
    at: float                     # seconds (the window's end)
    rate: float                   # requests/s arriving over the window
    replicas: int                 # replicas serving now
    itl_p50: float | None = None  # observed median inter-token latency, s
    prompt_tokens: float | None = None   # mean lengths over the window (reported)
    output_tokens: float | None = None
    hit_rate: float | None = None
    completed: float | None = None       # requests/s finished over the window
    in_system: float | None = None       # requests inside the engines at the window's end
    waiting: float | None = None         # of them, queued (not yet running)


@dataclass(frozen=True)
class Prediction:
    capacity: float               # one replica's SLO capacity at this mix, req/s
    itl_p50: float | None = None  # expected median inter-token latency at rate/replica
    # ... at any per-replica rate (None: itl_p50 at every rate); what `slowdown` solves with
    itl_at: Callable[[float], float | None] | None = None


def slowdown(observed: float, rate: float, itl_at: Callable[[float], float | None],
             around: float) -> float:
    """The s in CORRECTION_BOUNDS with s * itl_at(rate * s) = observed (time scaling, see
    the module): bisection on log s from the bracket [around / 2, 2 around] (moved to the
    bounds' side when the root lies outside it), then linear interpolation between the
    last two points (exact when itl_at is flat). itl_at(x) None (no request finished at
    rate x) counts as longer than any observation."""
    def excess(s: float) -> float:
        itl = itl_at(rate * s)
        return math.inf if itl is None else s * itl - observed
    lo_bound, hi_bound = CORRECTION_BOUNDS
    lo, hi = max(lo_bound, around / 2), min(hi_bound, around * 2)
    f_lo, f_hi = excess(lo), excess(hi)
    if f_lo > 0:                       # the root is below the bracket
        hi, f_hi, lo = lo, f_lo, lo_bound
        f_lo = excess(lo)
        if f_lo >= 0:
            return lo_bound
    elif f_hi < 0:                     # above it
        lo, f_lo, hi = hi, f_hi, hi_bound
        f_hi = excess(hi)
        if f_hi <= 0:
            return hi_bound
    for _ in range(SLOWDOWN_STEPS):    # f_lo <= 0 <= f_hi
        mid = math.sqrt(lo * hi)
        f = excess(mid)
        if f < 0:
            lo, f_lo = mid, f
        else:
            hi, f_hi = mid, f
    if math.isinf(f_hi):
        return math.sqrt(lo * hi)
    return lo + (hi - lo) * -f_lo / (f_hi - f_lo) if f_hi > f_lo else lo


@dataclass
class Decision:
    at: float
    replicas: int
    reason: str
    rate: float | None = None
    forecast: float | None = None
    capacity: float | None = None     # predicted, per replica
    correction: float | None = None
    corrected_capacity: float | None = None
    wanted: int | None = None         # before the bounds and the stabilisation


def steady(obs: Observation) -> bool:
    """The service neither filled nor drained a queue over the window (arrivals within
    STEADY_SHARE of completions, when the observation has both): only then do its
    inter-token gaps say how fast its steps are rather than how long its queue grew (in
    the fleet replay a correction learned during a 4x step asked for twice the replicas
    for minutes after it)."""
    if obs.completed is None:
        return True
    return abs(obs.rate - obs.completed) <= STEADY_SHARE * obs.completed


@dataclass
class Planner:
    spec: PlannerSpec
    correction: float = 1.0
    last_arrival: float | None = None
    _wanted: deque = field(default_factory=deque)   # (at, wanted) within the stabilisation
    forecaster: Forecaster | None = None

    def __post_init__(self) -> None:
        if self.forecaster is None:
            # replicas asked for now serve after the start-up, for an interval: the forecast
            # looks as far ahead
            self.forecaster = Forecaster(self.spec.forecast,
                                         1 + self.spec.startup / self.spec.interval)

    def hold(self, at: float, replicas: int, why: str) -> Decision:
        """No usable observation: keep the replicas."""
        return Decision(at=at, replicas=replicas, reason=f"unchanged: {why}")

    def wake(self, at: float, held: int) -> Decision:
        """Requests wait at the router while no replica serves (zero replicas): Prometheus
        has no series of the service then, so this, not the observation, brings the
        first replicas back, at once."""
        self.last_arrival = at
        wanted = max(1, self.spec.min_replicas)
        self._wanted.append((at, wanted))
        return Decision(at=at, replicas=wanted, wanted=wanted,
                        reason=f"{held} request(s) held by the router with no replica serving")

    def decide(self, obs: Observation, pred: Prediction) -> Decision:
        spec = self.spec
        if obs.rate > 0:
            self.last_arrival = obs.at
        elif self.last_arrival is None:
            self.last_arrival = obs.at - spec.interval   # idle since before the first look
        itl_at = pred.itl_at or (pred.itl_p50 and (lambda _rate: pred.itl_p50))
        if obs.itl_p50 and itl_at and obs.rate > 0 and steady(obs):
            ratio = slowdown(obs.itl_p50, obs.rate / max(1, obs.replicas), itl_at,
                             self.correction)
            self.correction += CORRECTION_WEIGHT * (ratio - self.correction)
        assert self.forecaster is not None
        forecast = self.forecaster.next(obs.rate)
        if pred.capacity <= 0:
            return self.hold(obs.at, obs.replicas, "the predicted capacity is 0: no "
                                                   "replica meets the SLOs at this mix")
        corrected = spec.utilisation * pred.capacity / self.correction
        idle_for = obs.at - self.last_arrival
        queue = (obs.waiting or 0.0) / spec.interval   # drain the queue within an interval
        arrivals = math.ceil(forecast / corrected - 1e-6) if forecast > 0 else 0
        if forecast + queue > 0:
            demand = forecast + queue
            wanted, why = max(1, math.ceil(demand / corrected - 1e-6)), (  # fit noise
                f"{demand:.3g} req/s / {corrected:.3g} req/s per replica")
            if queue:
                why += f" ({forecast:.3g} arriving + {obs.waiting:.0f} waiting to clear " \
                       f"in {spec.interval:.0f} s)"
        elif idle_for >= spec.idle_window:
            wanted, why = 0, f"no request for {idle_for:.0f} s"
        elif obs.replicas == 0:   # e.g. a restarted planner: only a request brings one
            wanted, why = 0, "no request and no replica: zero stays"
        else:
            wanted, why = 1, f"idle for {idle_for:.0f} s (< {spec.idle_window:.0f} s)"
        bounded = min(max(wanted, spec.min_replicas), spec.max_replicas)
        if bounded != wanted:
            why += f"; bounded to [{spec.min_replicas}, {spec.max_replicas}]"
        self._wanted.append((obs.at, min(arrivals, spec.max_replicas)))
        while self._wanted and self._wanted[0][0] < obs.at - spec.scale_down_stabilization:
            self._wanted.popleft()
        replicas = bounded
        if bounded < obs.replicas:
            held = max(w for _, w in self._wanted)
            if held > bounded:
                replicas = min(held, obs.replicas)
                why += (f"; scale-down held at {replicas} (the arrivals wanted {held} within "
                        f"{spec.scale_down_stabilization:.0f} s)")
        return Decision(at=obs.at, replicas=replicas, reason=why, rate=obs.rate,
                        forecast=forecast, capacity=pred.capacity,
                        correction=self.correction, corrected_capacity=corrected,
                        wanted=wanted)
