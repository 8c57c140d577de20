"""When a capacity probe's verdict is already decided, so a simulated probe can stop.

A probe (tuner/measure/capacity.py) is judged on its *settled* requests only: those that
arrived by the cutoff (SETTLED_FRACTION of the window); the share of them that met every
SLO of their kind. That share is final before the window ends:

- **exactly**, once the clock has passed the cutoff (every settled request has arrived)
  and each settled request still running is a certain miss. What the rest of the window
  does only touches requests the verdict ignores;
- **as a failure**, once even counting every settled request not yet known to miss as a
  success leaves the share below `give_up_below` (the target attainment; the number of
  settled arrivals is known up front: arrival times are a function of the stream's seed
  and rate alone). The share then recorded is the run's so far, not the final one
  (`failed` says so); the capacity search runs again in full the one such probe whose
  share it reads (simulate.sim_capacity).

A running request is a certain miss when a lower bound of its final figure already
exceeds its limit: with no token yet, its TTFT is more than the time waited; its E2E is
more than the time since arrival; with its first token at t1 and `max_tokens` tokens due
(the simulator ignores EOS), its TPOT is more than (now - t1) / (max_tokens - 1).
"""
from __future__ import annotations

from tuner.measure.capacity import SETTLED_FRACTION
from tuner.measure.scoring import meets_slo

CHECK_EVERY = 1.0   # virtual seconds between checks (a check scans the running requests)


class Settling:
    def __init__(self, slos: dict, *, duration: float, front: float, settled_arrivals: int,
                 give_up_below: float = 0.0, start: float = 0.0) -> None:
        """`start`: when the scored window begins (the simulation's warm-up before it);
        `settled_arrivals`: how many arrive between it and the cutoff."""
        self.slos, self.front = slos, front
        self.start, self.cutoff = start, start + SETTLED_FRACTION * duration
        self.expected, self.give_up_below = settled_arrivals, give_up_below
        self.misses = 0          # settled requests finished outside their SLOs
        self.next_check = 0.0
        self.failed = False      # stopped as a certain failure, its share not final

    def finished(self, record: dict) -> None:
        if self.start <= record["start"] <= self.cutoff and not meets_slo(
                record, self.slos.get(record["kind"], {})):
            self.misses += 1

    def certain_miss(self, request, times: list[float], now: float) -> bool:
        slo = self.slos.get(request.kind, {})
        waited = now - request.arrival + self.front
        if waited > slo.get("e2e", float("inf")):
            return True
        if not times:
            return waited > slo.get("ttft", float("inf"))
        due = request.max_tokens - 1
        return due > 0 and (now - times[0]) / due > slo.get("tpot", float("inf"))

    def decided(self, live: dict, now: float) -> bool:
        """Whether the settled share is decided at `now`; `live`: request id -> (request,
        record, token times) of the running ones. Checked every CHECK_EVERY s at most."""
        if now < self.next_check:
            return False
        self.next_check = now + CHECK_EVERY
        settled = [(req, times) for req, _, times in live.values()
                   if self.start <= req.arrival <= self.cutoff]
        missing = sum(self.certain_miss(req, times, now) for req, times in settled)
        if now >= self.cutoff and missing == len(settled):
            return True
        if self.give_up_below > 0 and self.expected > 0:
            best = (self.expected - self.misses - missing) / self.expected
            self.failed = best < self.give_up_below
            return self.failed
        return False
