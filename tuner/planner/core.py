"""The SLO planner's arithmetic (issue 38): from what the service does now to how many
replicas it needs, every interval, with the reason written down.

Every interval the planner gets an Observation (the arrival rate and mix over the last
window, the observed inter-token latency, the replicas running) and a Prediction for that
mix (one replica's SLO capacity from the profile and simulator, and the inter-token
latency the simulator expects at the observed per-replica rate). Then:

1. correction: the observed / predicted inter-token latency is how much slower (> 1) or
   faster the service's steps are than the profile's (a decode step's time is what the
   inter-token gap is made of); smoothed over intervals (CORRECTION_WEIGHT to the newest),
   clamped to [1/4, 4], and learned only from a steady window (`steady`: no queue
   filling or draining); the corrected capacity is the predicted one divided by it;
2. forecast: the next interval's rate (tuner/planner/forecast.py): `none` repeats the
   observed one, `holt` projects its trend;
3. wanted = ceil((forecast + waiting / interval) / corrected capacity): the arrivals and
   the requests queued now, cleared within one interval (a fleet sized to its arrivals
   alone never drains a queue it built while scaling: bench_planner.py's replicas at 90 %
   of their capacity kept one for minutes); at least one while any request arrives;
   zero only when `min_replicas` is 0 and no request arrived for `idle_window` s (or
   none arrives while it is at zero already);
4. bounds: within [min_replicas, max_replicas];
5. stabilisation (the HPA's rule): scaling up is immediate, scaling down goes only to the
   highest wanted count of the last `scale_down_stabilization` s, so a dip does not shed
   replicas that the next minute needs again.
Without an observation (Prometheus unreachable, or no data) the replicas stay as they are
and the decision says why. At zero replicas, requests held by the router (`wake`) bring
the first replica back.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tuner.planner.forecast import FORECASTS, Forecaster

CORRECTION_WEIGHT = 0.5
CORRECTION_BOUNDS = (0.25, 4.0)
STEADY_SHARE = 0.1   # arrivals within 10 % of completions: the window's gaps are the steps'


@dataclass(frozen=True)
class PlannerSpec:
    min_replicas: int = 1
    max_replicas: int = 8
    target_attainment: float = 0.9
    interval: float = 30.0
    scale_down_stabilization: float = 300.0
    idle_window: float = 600.0
    forecast: str = "none"

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"minReplicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError(f"maxReplicas ({self.max_replicas}) must be >= 1 and >= "
                             f"minReplicas ({self.min_replicas})")
        if not 0 < self.target_attainment <= 1:
            raise ValueError(f"targetAttainment must be in (0, 1], got {self.target_attainment}")
        if self.interval <= 0 or self.scale_down_stabilization < 0 or self.idle_window < 0:
            raise ValueError("interval must be > 0; scaleDownStabilization and the idle "
                             "window >= 0 (seconds)")
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
            self.forecaster = Forecaster(self.spec.forecast)

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
        if obs.itl_p50 and pred.itl_p50 and obs.rate > 0 and steady(obs):
            ratio = min(max(obs.itl_p50 / pred.itl_p50, CORRECTION_BOUNDS[0]),
                        CORRECTION_BOUNDS[1])
            self.correction += CORRECTION_WEIGHT * (ratio - self.correction)
        assert self.forecaster is not None
        forecast = self.forecaster.next(obs.rate)
        if pred.capacity <= 0:
            return self.hold(obs.at, obs.replicas, "the predicted capacity is 0: no "
                                                   "replica meets the SLOs at this mix")
        corrected = pred.capacity / self.correction
        idle_for = obs.at - self.last_arrival
        queue = (obs.waiting or 0.0) / spec.interval   # drain the queue within an interval
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
        self._wanted.append((obs.at, bounded))
        while self._wanted and self._wanted[0][0] < obs.at - spec.scale_down_stabilization:
            self._wanted.popleft()
        replicas = bounded
        if bounded < obs.replicas:
            held = max(w for _, w in self._wanted)
            if held > bounded:
                replicas = min(held, obs.replicas)
                why += (f"; scale-down held at {replicas} (wanted {held} within "
                        f"{spec.scale_down_stabilization:.0f} s)")
        return Decision(at=obs.at, replicas=replicas, reason=why, rate=obs.rate,
                        forecast=forecast, capacity=pred.capacity,
                        correction=self.correction, corrected_capacity=corrected,
                        wanted=wanted)
