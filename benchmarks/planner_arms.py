"""The scalers bench_planner.py replays its traffic script against (tuner/sim/fleet.py).

- `PlannerArm`: the SLO planner itself (tuner/planner/core.py's Planner, unchanged) fed
  as `python -m tuner plan` feeds it: every interval an Observation of the last
  2 intervals (requests arrived per second as tuner/planner/observe.py reads them: the
  finished ones plus the growth of those inside the engines; the median inter-token gap;
  the replicas),
  a Prediction from the simulator on the planner's profile (one replica's capacity at the
  workload's mix, the gap expected at the rate each replica gets), and at zero replicas
  the router's held requests, looked at every second (tuner/planner/run.py WAKE_POLL),
  as the wake-up.
- `HpaArm`: Kubernetes' HPA on the per-pod queue depth (vllm:num_requests_waiting, mode
  metrics' `queueDepth`), its target as the tuner derives it (the depth measured at one
  replica's capacity, floored at 0.1; docs/tuning-in-cluster.md), with the controller's
  rules: every 15 s desired = ceil(ready x mean / target) outside a 10 % tolerance,
  scale-up at most +100 % or +4 pods per period, scale-down to the highest recommendation
  of the stabilisation window, at least one replica (the HPA cannot reach zero).
- `OracleArm`: every second, ceil(rate / true capacity) for the rate of the next
  start-up time (the script is known, the capacity measured on the fleet's own engine).
"""
from __future__ import annotations

import math
import statistics
from collections import deque

from tuner.planner.core import Observation, Planner, PlannerSpec, Prediction
from tuner.planner.run import WAKE_POLL, WINDOW_FACTOR
from tuner.sim.fleet import oracle_replicas

class SimPrediction:
    """One replica's capacity on the planner's profile (once: the mix is the workload's)
    and the inter-token gap expected at a per-replica rate (by rate to 2 digits)."""

    def __init__(self, ctx, settings: dict) -> None:
        self.ctx, self.settings = ctx, settings
        self.capacity = ctx.capacity(settings).rate
        self._itl: dict[float, float | None] = {}

    def itl_at(self, per_replica_rate: float) -> float | None:
        key = float(f"{per_replica_rate:.2g}")
        if key not in self._itl:
            self._itl[key] = self.ctx.run(self.settings, key).figures.get("itl_p50")
        return self._itl[key]

    def __call__(self, per_replica_rate: float) -> Prediction:
        return Prediction(capacity=self.capacity, itl_p50=self.itl_at(per_replica_rate),
                          itl_at=self.itl_at)


class PlannerArm:
    name = "planner"

    period = WAKE_POLL

    def __init__(self, spec: PlannerSpec, predict) -> None:
        self.planner, self.predict = Planner(spec), predict
        self.interval, self.window = spec.interval, spec.interval * WINDOW_FACTOR
        self.next_tick = spec.interval
        self.last: Prediction | None = None
        self.decisions: list = []

    def __call__(self, fleet, at: float) -> int:
        if fleet.desired == 0:   # no series without pods: only held requests wake it
            if fleet.held:
                decision = self.planner.wake(at, len(fleet.held))
                self.decisions.append(decision)
                self.next_tick = at + self.interval
                return decision.replicas
            return 0
        if at < self.next_tick - 1e-9:
            return fleet.desired
        self.next_tick = at + self.interval
        done = fleet.finished_between(at - self.window, at)
        gaps = [g for r in done for g in r["itl"]]
        now = fleet.in_system(at)
        grown = now - fleet.in_system(at - self.window)
        obs = Observation(at=at, rate=max(0, len(done) + grown) / self.window,
                          replicas=fleet.desired, completed=len(done) / self.window,
                          in_system=now, waiting=float(sum(fleet.queue_depths())),
                          itl_p50=statistics.median(gaps) if gaps else None)
        if obs.rate > 0:
            self.last = self.predict(obs.rate / max(1, fleet.desired))
        decision = self.planner.decide(obs, self.last or Prediction(capacity=math.inf))
        self.decisions.append(decision)
        return decision.replicas


class HpaArm:
    name = "hpa"
    period = 15.0
    tolerance = 0.1

    def __init__(self, target: float, *, max_replicas: int, stabilization: float) -> None:
        self.target, self.max, self.stabilization = max(0.1, target), max_replicas, stabilization
        self._recent: deque = deque()

    def __call__(self, fleet, at: float) -> int:
        current, depths = fleet.desired, fleet.queue_depths()
        if not depths:   # nothing ready yet: no metric, no change
            return max(1, current)
        ratio = statistics.fmean(depths) / self.target
        wanted = current if abs(ratio - 1) <= self.tolerance else math.ceil(len(depths) * ratio)
        wanted = min(max(wanted, 1), self.max)
        self._recent.append((at, wanted))
        while self._recent[0][0] < at - self.stabilization:
            self._recent.popleft()
        if wanted > current:
            return min(wanted, max(2 * current, current + 4))
        return max(min(current, max(w for _, w in self._recent)), 1)


class OracleArm:
    """ceil(rate / capacity) replicas, the rate known exactly. With foresight (the oracle),
    started a start-up ahead of the rate that needs them; without (the reactive oracle),
    asked for when that rate arrives: the best any scaler that reacts to what it observes
    can do, however exact its measurement and prediction (only a forecast can beat it)."""

    period = 1.0

    def __init__(self, script, capacity: float, startup: float, max_replicas: int, *,
                 foresight: bool = True) -> None:
        self.script, self.capacity = script, capacity
        self.startup, self.max = startup, max_replicas
        self.ahead = startup + 1 if foresight else 0.0
        self.name = "oracle" if foresight else "oracle-reactive"

    def __call__(self, fleet, at: float) -> int:
        return min(oracle_replicas(self.script, self.capacity, at, self.ahead), self.max)
