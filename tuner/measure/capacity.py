"""Capacity for the autoscaler: the highest open-loop load one replica takes within SLOs.

A short rate search around the tuned point, on one engine with the winning settings:

1. start at `start` req/s (the winner's measured throughput);
2. bracket: multiply by `growth` (default 2) while a probe passes, divide while it fails
   (at most `max_probes`; a warm start near the answer brackets faster with a smaller one);
   with `max_growth` above `growth` the factor squares after each step in the same
   direction, up to `max_growth`: a start within one small step of the knee brackets in
   two probes, a far one still in a few (1.08, 1.17, 1.36, 1.85, 2: 3.2x by the fifth);
3. bisect geometrically until hi/lo <= 1 + `rel_tol`.

A probe at rate r runs the workload open-loop (Poisson at r, or a trace replayed at the
speed that gives r) for `duration` s and passes when at least `attainment` (default 0.9)
of the requests sent in the first 75 % of the window met every SLO. Requests still
running at the stop count as misses only when sent that early (by then they have run for
a quarter of the window: an overloaded queue), so a short window does not penalise the
last few requests of a healthy run. One measurement per probe: the search assumes that
a higher rate never does better, and its answer is known to within the final bracket.

A probe also fails when its queue grows faster than the replica could hold for
SUSTAIN_SECONDS (`queue_growth`): a window is short beside a TTFT SLO (chat on a CPU: 3 s
against 8-10 s probes), so an overloaded replica passed while its queue built. Chat's
embedded-model engine at 48 sequences passed 72.5 req/s, and 40 s at that rate took its
median TTFT from 1.1 s (the first 5 s) to 9 s (the fourth 5 s); at 50 req/s from 0.06 s
to 2.9 s (2026-12-07). The settled requests' TTFT in their kind's SLO (a request with no
first token: infinite) is compared between the window's earlier and later half (by send
time, medians); the probe holds when the later half's, grown at that pace for
SUSTAIN_SECONDS more, stays within the SLO. Only a shift of the whole later half counts as
growth (its lower quartile above the earlier half's upper quartile): a queue that builds
delays every later request, while a busy period of a stable queue lifts a few of them, and
a few-second window read 60 s ahead turned such bursts into failures (the embedded model
at one sequence, 5-s probes: passing and failing rates interleaved around the knee).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.measure.loadgen import LoadSpec
from tuner.measure.scoring import Samples, load_samples, meets_slo

SETTLED_FRACTION = 0.75
SUSTAIN_SECONDS = 60.0   # how long a passing rate must hold its queue within the TTFT SLO
PROBE_SEED_STRIDE = 1000   # probe k of a search loads seed + k * this (rounds: seed + r)
WARMUP_PROBE = 999         # the warm-up load's stream: a probe number no search reaches


def settled_attainment(samples: Samples, slos: dict) -> tuple[float, int]:
    """(share of early requests that met their SLOs, how many early requests)."""
    if samples.start is None or samples.stop is None:
        raise ValueError("the samples have no start/stop markers")
    cutoff = samples.start + SETTLED_FRACTION * (samples.stop - samples.start)
    early = [r for r in samples.records if r["start"] <= cutoff]
    if not early:
        return 0.0, 0
    good = sum(meets_slo(r, slos.get(r.get("kind"), {})) for r in early)
    return good / len(early), len(early)


def queue_growth(samples: Samples, slos: dict) -> tuple[float, float] | None:
    """(the later half's median TTFT as a share of its SLO, that share's growth per second
    from the earlier half's) over the settled requests that have a TTFT SLO, halved by send
    time and compared at their medians (a request without a first token: an infinite
    share); the growth is 0 unless the later half's lower quartile lies above the earlier
    half's upper quartile (a shift, not a burst); None with fewer than 4 such requests or
    without markers."""
    if samples.start is None or samples.stop is None:
        return None
    cutoff = samples.start + SETTLED_FRACTION * (samples.stop - samples.start)
    timed = sorted((r["start"], r["ttft"] / slo if r.get("ok") and r.get("ttft") is not None
                    else math.inf)
                   for r in samples.records if r["start"] <= cutoff
                   for slo in [slos.get(r.get("kind"), {}).get("ttft")] if slo)
    if len(timed) < 4:
        return None
    half = len(timed) // 2
    (sent_early, early), (sent_late, late) = (
        map(statistics.median, zip(*rows)) for rows in (timed[:half], timed[half:]))
    if math.isinf(late):
        return late, math.inf
    if _quartiles(timed[half:])[0] <= _quartiles(timed[:half])[1]:
        return late, 0.0   # the halves overlap: no shift to extrapolate
    return late, (late - early) / max(sent_late - sent_early, 1e-9)


def _quartiles(rows: list[tuple[float, float]]) -> tuple[float, float]:
    """(lower, upper) quartile of the rows' shares, each a share of the rows (nearest
    rank: no arithmetic on the infinite share of a request without a first token)."""
    shares = sorted(share for _, share in rows)
    k = (len(shares) - 1) // 4
    return shares[k], shares[-1 - k]


def probe_verdict(samples: Samples, slos: dict, attainment: float,
                  sustain: float = SUSTAIN_SECONDS) -> dict:
    """A probe's figures and verdict: {"attainment", "requests", "growth", "passed"}: the
    settled share met the target and the queue holds for `sustain` s more (queue_growth;
    growth None: no TTFT SLO or too few requests to tell, then the share alone; `sustain`
    0: the later half's median within its SLO now)."""
    check_sustain(sustain)
    share, count = settled_attainment(samples, slos)
    grown = queue_growth(samples, slos)
    holds = grown is None or grown[0] + max(grown[1], 0.0) * sustain <= 1.0
    return {"attainment": share, "requests": count,
            "growth": None if grown is None else grown[1],
            "passed": count > 0 and share >= attainment and holds}


def check_sustain(sustain: float) -> float:
    """`sustain` if it is a number of seconds >= 0, else ValueError naming the flag."""
    if not (isinstance(sustain, (int, float)) and math.isfinite(sustain) and sustain >= 0):
        raise ValueError(f"sustain (--sustain, spec.capacity.sustainSeconds) is the seconds "
                         f"a passing rate's queue must hold, >= 0; got {sustain!r}")
    return float(sustain)


@dataclass
class CapacityResult:
    rate: float                # highest passing rate found (req/s per replica); 0: none
    upper: float | None        # lowest failing rate (None: every probe passed)
    attainment: float
    probes: list[dict] = field(default_factory=list)

    def line(self) -> str:
        bound = f", the lowest failing {self.upper:.2f} req/s" if self.upper else \
            " (no probe failed: the search's ceiling)"
        return (f"capacity: {self.rate:.2f} req/s per replica meets the SLOs for >= "
                f"{self.attainment:.0%} of requests{bound}; {len(self.probes)} probes")


def search_capacity(probe: Callable[[float], Samples], slos: dict, *, start: float,
                    attainment: float = 0.9, rel_tol: float = 0.15,
                    max_probes: int = 8, growth: float = 2.0,
                    max_growth: float | None = None,
                    sustain: float = SUSTAIN_SECONDS) -> CapacityResult:
    """Bracket then bisect the open-loop rate; `probe(rate)` runs one load; `sustain`:
    probe_verdict's."""
    check_sustain(sustain)
    if not start > 0:
        raise ValueError(f"the capacity search needs a positive start rate, got {start}")
    if not growth > 1:
        raise ValueError(f"the bracketing growth must be > 1, got {growth}")
    if max_growth is not None and max_growth < growth:
        raise ValueError(f"max_growth ({max_growth}) must be at least growth ({growth})")
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment must be in (0, 1], got {attainment}")
    result = CapacityResult(rate=0.0, upper=None, attainment=attainment)

    def passes(rate: float) -> bool:
        verdict = probe_verdict(probe(rate), slos, attainment, sustain)
        result.probes.append({"rate": rate, **verdict})
        return verdict["passed"]

    lo, hi, rate, step = None, None, start, growth
    while len(result.probes) < max_probes and (lo is None or hi is None):
        if passes(rate):
            lo, rate = rate, rate * step
        else:
            hi, rate = rate, rate / step
        step = min(step * step, max_growth or growth)
    while (lo is not None and hi is not None and hi / lo > 1 + rel_tol
           and len(result.probes) < max_probes):
        mid = math.sqrt(lo * hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    result.rate, result.upper = lo or 0.0, hi
    return result


def bracket(result: CapacityResult) -> tuple[dict | None, dict | None]:
    """(the highest passing probe, the lowest failing probe above it): either None when
    there is none."""
    passed = [p for p in result.probes if p["passed"]]
    if not passed:
        return None, None
    lo = max(passed, key=lambda p: p["rate"])
    above = [p for p in result.probes if not p["passed"] and p["rate"] > lo["rate"]]
    return lo, min(above, key=lambda p: p["rate"]) if above else None


def interpolated(result: CapacityResult) -> float:
    """The rate where attainment crosses the target, read linearly between the highest
    passing and the lowest failing probe (their own attainments), so that two searches
    whose brackets coincide still tell a 5 % difference apart; the passing rate itself
    when nothing above it failed or the failure above met the target (its queue grew),
    0 when nothing passed."""
    lo, hi = bracket(result)
    if lo is None:
        return 0.0
    if hi is None or hi["attainment"] >= result.attainment:   # (hi: its queue grew)
        return lo["rate"]
    drop = lo["attainment"] - hi["attainment"]
    share = (lo["attainment"] - result.attainment) / drop if drop > 0 else 0.0
    return lo["rate"] + min(max(share, 0.0), 1.0) * (hi["rate"] - lo["rate"])


def probe_load(load: LoadSpec, k: int) -> LoadSpec:
    """The load of a search's probe k: its own seed, so its own requests. Replaying the
    previous probe's requests on the same engine finds them in its prefix cache (a
    multi-turn session's whole history, a document to summarize): the later probes of a
    search then passed rates the engine cannot serve (a summarize search passed 16.35
    req/s on an engine whose first probe failed at 10.6)."""
    return dataclasses.replace(load, seed=load.seed + PROBE_SEED_STRIDE * k)


def rate_load(load: LoadSpec, rate: float, *, trace_rate: float | None = None) -> LoadSpec:
    """The open-loop load at `rate`: Poisson arrivals, or the trace at the matching speed."""
    if load.trace is not None:
        if not trace_rate:
            raise ValueError("a trace load needs the trace's own rate to scale it")
        return dataclasses.replace(load, trace_speed=rate / trace_rate)
    return dataclasses.replace(load, arrival="open", rate=rate)


def after_lead(samples: Samples, lead: float) -> Samples:
    """A probe's scored window: the requests that arrived `lead` s or more after its load
    began, the window starting there."""
    if lead <= 0 or samples.start is None:
        return samples
    begin = samples.start + lead
    return Samples([r for r in samples.records if r["start"] >= begin], begin, samples.stop)


def measure_capacity(settings: dict, launch, load: LoadSpec, slos: dict, *, workdir: Path,
                     start: float, trace_rate: float | None = None, warmup_requests: int = 0,
                     warmup_load: int = 0, lead: float = 0.0,
                     watch: Callable[[str], Callable[[], None]] | None = None,
                     **search) -> CapacityResult:
    """One engine with these settings (tuner.measure.local.EngineLaunch), probed at several
    rates; `warmup_requests` are sent (and not scored) before the first probe only, and
    every later probe waits until the engine has drained the previous one. `warmup_load`:
    before the first probe, about that many requests of the workload (its own stream, at
    the first probe's rate, for at most one load's duration; none for a trace) are served
    and not scored, so that the first probe, as the later ones, finds the engine in the
    workload's steady state (a filled prefix cache), as the simulator's warm-up does
    (tuner/sim/simulate.py): SmolLM2's rag served 0 of 197 requests at 5.5 req/s within
    its SLOs from a fresh engine, 143 after 40 s at 3 req/s. `lead`: each probe's load
    runs that many seconds longer, first, and only the requests that arrive after it are
    scored (`after_lead`): the window then finds the queue the probe's own rate builds, as
    a simulated load after its warm-up does, where without it every probe starts on an
    empty queue (the load client's stop drops what the previous one left running), a
    transient that passes rates a little past the knee (none for a trace). `watch(url)`,
    once the engine is up, starts watching it and returns what stops the watch (called
    before the engine stops). Each probe records the engine's gauges' means during its
    load (`gauges`: num_requests_waiting_mean, ...), which an autoscaler's target is read
    from."""
    from tuner.measure.engine_process import EngineStartError
    from tuner.measure.runner import Infeasible
    from tuner.measure.server_metrics import wait_idle
    from tuner.measure.trial import measure

    from tuner.measure.server_metrics import GAUGES

    engine = launch.process(settings, workdir / "engine.log")
    probes = iter(range(1000))
    done: list[Path] = []  # probes run so far
    means = {name.split(":", 1)[1] + "_mean" for name in GAUGES}
    gauges: dict[float, dict] = {}   # rate -> the engine's gauges' means during its probe

    def probe(rate: float) -> Samples:
        k = next(probes)
        where = workdir / f"probe-{k:02d}"
        if not done and warmup_load > 0 and load.trace is None:
            warm = rate_load(probe_load(load, WARMUP_PROBE), rate)
            measure(engine.url, dataclasses.replace(
                warm, duration=min(load.duration, warmup_load / rate)), slos,
                workdir=workdir / "warmup", warmup_requests=warmup_requests)
            done.append(workdir / "warmup")
        if done:   # an overrun probe's backlog must not slow this one down
            wait_idle(engine.url)
        run = rate_load(probe_load(load, k), rate, trace_rate=trace_rate)
        if lead > 0 and load.trace is None:
            run = dataclasses.replace(run, duration=run.duration + lead)
        figures = measure(engine.url, run, slos, workdir=where,
                          warmup_requests=warmup_requests if not done else 0)
        gauges[rate] = {k: figures[k] for k in sorted(means & set(figures or {}))}
        done.append(where)
        samples = load_samples(where / "samples.jsonl")
        return after_lead(samples, lead) if load.trace is None else samples

    try:
        try:
            engine.start(timeout=launch.startup_timeout)
        except EngineStartError as exc:
            raise Infeasible(exc.reason) from None
        stop_watching = watch(engine.url) if watch is not None else None
        try:
            result = search_capacity(probe, slos, start=start, **search)
            for p in result.probes:   # what an autoscaler on those gauges would see
                p["gauges"] = gauges.get(p["rate"], {})
            return result
        finally:
            if stop_watching is not None:
                stop_watching()
    finally:
        engine.stop()


def for_sweep(study, config, *, trace_rate: float | None = None,
              max_probes: int = 8, sustain: float = SUSTAIN_SECONDS) -> CapacityResult:
    """The capacity search for a finished sweep: its winner's settings (or the baseline's,
    when nothing beat it), starting at the winner's measured goodput; written to
    <out-dir>/capacity.json."""
    import json

    from tuner.search.report import summary

    s = summary(study)
    if s is None:
        raise ValueError("no feasible trial: no settings to measure the capacity of")
    start = max(s["goodput"], 0.5 / config.load.duration)
    workdir = config.out_dir / "capacity"
    result = measure_capacity({**config.fixed, **s["params"]}, config.launch,
                              config.load, config.slos, workdir=workdir, start=start,
                              trace_rate=trace_rate, max_probes=max_probes, sustain=sustain)
    (config.out_dir / "capacity.json").write_text(json.dumps(
        {"settings": s["params"], "rate_per_replica": result.rate, "upper": result.upper,
         "attainment": result.attainment, "sustain_s": sustain, "probes": result.probes},
        indent=2))
    return result
