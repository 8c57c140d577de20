"""A fleet of replicas in one virtual time, for replaying a traffic script against a
scaler (the SLO planner's benchmark, benchmarks/bench_planner.py; docs/planner.md).

- Arrivals: a scripted rate r(t) (`Script`: piecewise linear, a step is two points at one
  time), drawn as a non-homogeneous Poisson process by thinning at the script's peak; each
  arrival takes the next request of the workload's stream (tuner/sim/stream.py: its
  prompts, lengths and sessions) at the script's time.
- Replicas: each an engine in virtual time (tuner/sim/engine.py: the engine's own
  scheduler and KV cache, the profile's step times), brought to the fleet's time at every
  event. A replica added serves `startup` s later (its cold start); one removed takes no
  new request and leaves once its in-flight requests are done (the preStop drain); each
  counts in replica-seconds from its start to its leaving.
- Router: a session's next turn goes back to the replica that served its last one while
  that replica serves and has at most AFFINITY_SLACK more unfinished requests than the
  least busy (its history's KV is cached there: the prefix-aware router's choice); else,
  and for a new session, to the serving replica with the fewest unfinished requests; with
  none serving it is held (the router's --cold-start-hold: at most HOLD_LIMIT requests,
  each for at most `hold` s) and sent when one serves; past either bound it fails (the
  router's 503).
- Scaler: `scaler(fleet, at)` is asked every `scaler.period` s and answers the replicas
  wanted; it may read what a Prometheus or the router would show (`finished_between`,
  `queue_depths`, `held`, `desired`).
Records have the load client's fields (tuner/measure/scoring.py), by arrival time.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from tuner.sim.engine import sim_engine
from tuner.sim.simulate import collect

HOLD_LIMIT = 64     # the router's bound on held requests (--cold-start-queue)
AFFINITY_SLACK = 4   # requests a session's replica may be busier than the least busy
DRAIN_LIMIT = 600.0  # virtual s after the script for in-flight requests to finish


class Script:
    """A rate over time from (t, rate) points, linear between them."""

    def __init__(self, points: list[tuple[float, float]]) -> None:
        if len(points) < 2 or any(b[0] < a[0] for a, b in zip(points, points[1:])):
            raise ValueError("a script needs at least two (time, rate) points in time order")
        if any(r < 0 for _, r in points):
            raise ValueError("a script's rates must be >= 0")
        self.points = points
        self.times = [t for t, _ in points]
        self.end = points[-1][0]
        self.peak = max(r for _, r in points)

    def rate(self, t: float) -> float:
        if t < self.times[0] or t >= self.end:
            return 0.0
        i = bisect.bisect_right(self.times, t) - 1   # the last point at or before t
        (t0, r0), (t1, r1) = self.points[i], self.points[i + 1]
        return r0 if t1 == t0 else r0 + (r1 - r0) * (t - t0) / (t1 - t0)

    def arrivals(self, seed: int) -> list[float]:
        rng, t, out = random.Random(seed), self.times[0], []
        if self.peak <= 0:
            return out
        while True:
            t += rng.expovariate(self.peak)
            if t >= self.end:
                return out
            if rng.random() * self.peak < self.rate(t):
                out.append(t)


@dataclass
class Replica:
    engine: object
    clock: object
    born: float
    serve_at: float
    leaving: bool = False
    gone_at: float | None = None
    live: dict = field(default_factory=dict)   # request id -> (request, record, token times)

    def serving(self) -> bool:
        return not self.leaving and self.gone_at is None and self.clock.now >= self.serve_at

    def advance(self, t: float, done: list) -> None:
        """Run steps until this replica's clock reaches t; finished records go to `done`."""
        while self.clock.now < t:
            if not self.engine.has_unfinished_requests():
                self.clock.now = t
                return
            before = self.clock.now
            done += collect(self.engine.step(), self.live, self.clock.now)
            if self.clock.now == before:
                self.clock.now = t


class Fleet:
    def __init__(self, profile, settings: dict, stream, script: Script, *, hf_config,
                 startup: float, hold: float = 600.0, seed: int = 0,
                 initial: int = 1, affinity: bool = True,
                 hold_limit: int = HOLD_LIMIT) -> None:
        self.profile, self.settings, self.stream = profile, settings, stream
        self.script, self.hf_config, self.seed = script, hf_config, seed
        self.startup, self.hold, self.hold_limit = startup, hold, hold_limit
        self.replicas: list[Replica] = []
        self.records: list[dict] = []
        self.finished: list[tuple[float, dict]] = []   # (finish time, record), in order
        self.held: list[tuple] = []                    # (request, record) waiting
        self.timeline: list[tuple[float, float, int, int]] = []  # t, rate, replicas, serving
        self.decisions: list[tuple[float, int]] = []
        self.affinity = affinity
        # a session (the object: held here, so no later session can take its identity)
        # -> the replica of its last turn
        self._home: dict[object, Replica] = {}
        for _ in range(initial):
            self._add(0.0, ready=True)

    @property
    def desired(self) -> int:
        return sum(not r.leaving and r.gone_at is None for r in self.replicas)

    def serving(self) -> list[Replica]:
        return [r for r in self.replicas if r.serving()]

    def finished_between(self, t0: float, t1: float) -> list[dict]:
        return [rec for t, rec in self.finished if t0 < t <= t1]

    def in_system(self, at: float) -> int:
        """Requests inside the replicas' engines at `at` (sent, not finished): what the
        engines' running + waiting gauges sum to."""
        return sum(1 for r in self.records if "sent" in r and r["sent"] <= at
                   and not (r.get("done", math.inf) <= at))

    def queue_depths(self) -> list[int]:
        return [r.engine.get_stats().num_requests_waiting for r in self.serving()]

    def _add(self, at: float, *, ready: bool = False) -> None:
        engine, clock = sim_engine(self.profile, self.settings, hf_config=self.hf_config,
                                   seed=self.seed + len(self.replicas))
        clock.now = at
        self.replicas.append(Replica(engine, clock, at, at if ready else at + self.startup))

    def _scale(self, at: float, wanted: int) -> None:
        self.decisions.append((at, wanted))
        current = [r for r in self.replicas if not r.leaving and r.gone_at is None]
        for _ in range(wanted - len(current)):
            self._add(at)
        # leaving: replicas still starting first (the newest), then the least busy
        order = sorted(current, key=lambda r: (r.clock.now >= r.serve_at, len(r.live),
                                               -r.born))
        for replica in order[:max(0, len(current) - wanted)]:
            replica.leaving = True

    def _send(self, req, record, at: float) -> None:
        serving = self.serving()
        target = min(serving, key=lambda r: len(r.live))
        home = self._home.get(req.session) if self.affinity else None
        if home is not None and home.serving() and \
                len(home.live) <= len(target.live) + AFFINITY_SLACK:
            target = home
        if req.session is not None:
            self._home[req.session] = target
        vocab = target.engine.info.vocab_size
        rid = f"f{len(self.records)}-{req.number}"
        target.engine.add_request(rid, [t % vocab for t in req.prompt_ids], SamplingParams(
            max_tokens=req.max_tokens, ignore_eos=True, temperature=0.0, detokenize=False),
            arrival_time=req.arrival)
        target.live[rid] = (req, record, [])
        record.update(replica=self.replicas.index(target), sent=at)

    def _at(self, t: float) -> None:
        done: list = []
        for replica in self.replicas:
            if replica.gone_at is None:
                replica.advance(t, done)
                if replica.leaving and not replica.live:
                    replica.gone_at = max(t, replica.clock.now)
        for req, record in sorted(done, key=lambda d: d[1]["done"]):
            self.finished.append((record["done"], record))
            self.stream.finished(req, record["output_tokens"])
        while self.held and t - self.held[0][0].arrival > self.hold:
            self.held.pop(0)[1]["error"] = "held past the router's cold-start hold (503)"
        if self.held and self.serving():
            for req, record in self.held:
                self._send(req, record, t)
            self.held.clear()

    def _arrive(self, t: float) -> None:
        req = self.stream.pop()
        req.arrival = t
        record = {"kind": req.kind, "start": t, "ok": False, "output_tokens": 0, "itl": []}
        self.records.append(record)
        if self.serving():
            self._send(req, record, t)
        elif len(self.held) < self.hold_limit:
            self.held.append((req, record))
        else:
            record["error"] = "the router's hold is full (503)"

    def run(self, scaler) -> "Fleet":
        """Replay the script with `scaler` asked every scaler.period s."""
        events = [(t, 0) for t in self.script.arrivals(self.seed)]
        events += [(k * scaler.period, 1) for k in range(1, int(self.script.end
                                                                 / scaler.period) + 1)]
        events += [(float(k), 2) for k in range(int(self.script.end) + 1)]
        for t, kind in sorted(events):
            self._at(t)
            if kind == 0:
                self._arrive(t)
            elif kind == 1:
                self._scale(t, scaler(self, t))
            else:
                self.timeline.append((t, self.script.rate(t), self.desired,
                                      len(self.serving())))
        end = self.script.end
        t = end
        while t < end + DRAIN_LIMIT and (self.held or any(r.live for r in self.replicas)):
            t += 1.0
            self._at(t)
        for req, record in self.held:
            record["error"] = "held at the end of the run"
        for replica in self.replicas:
            for req, record, _ in replica.live.values():
                record["error"] = "unfinished at the end of the run"
            if replica.gone_at is None:
                replica.gone_at = end
        return self

    def replica_seconds(self) -> float:
        return sum(min(r.gone_at if r.gone_at is not None else self.script.end,
                       self.script.end) - r.born
                   for r in self.replicas if r.born < self.script.end)


def violation_seconds(records: list[dict], slos: dict, *, target: float, end: float,
                      window: float = 10.0) -> float:
    """Seconds of the script whose window (by arrival) has an SLO attainment below
    `target` (a failed request misses every SLO); windows without a request do not count."""
    from tuner.measure.scoring import meets_slo

    bins: dict[int, list[bool]] = {}
    for r in records:
        bins.setdefault(int(r["start"] // window), []).append(
            meets_slo(r, slos.get(r.get("kind"), {})))
    return window * sum(1 for k, met in bins.items()
                        if k * window < end and sum(met) / len(met) < target)


def oracle_replicas(script: Script, capacity: float, at: float, ahead: float) -> int:
    """ceil(rate / capacity) over [at, at + ahead] (the replicas that must be serving by
    then, so started now)."""
    steps = max(1, math.ceil(ahead))
    peak = max(script.rate(at + ahead * i / steps) for i in range(steps + 1))
    return math.ceil(peak / capacity - 1e-9) if peak > 0 else 0
