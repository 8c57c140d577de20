"""One simulated load: a request stream through the engine in virtual time (tuner/sim/
engine.py), scored with the tuner's own code, and the capacity search on top of it.

The loop hands the engine every request whose arrival time has come, then runs one
engine step (the profiled runner moves the clock by the step's time); with nothing to
run the clock jumps to the next arrival. Arrivals stop at `duration`, and so does the
run: requests still running then are recorded unfinished, as the load client records
them when Locust stops. Records have the load client's fields (tuner/measure/scoring.py),
so goodput, quantiles and the capacity search's settled attainment are computed by the
same functions as for a real trial.

`front` is the time a request spends outside the engine's steps on its way to the client
(HTTP, the chat template and tokenisation, streaming the first chunk): the profile times
steps only, so a light load's real TTFT exceeds the simulated one by about that much.
It is added to every request's TTFT and E2E; `front_seconds` measures it from a real and a
simulated run of one stream at one light rate.

`warmup` virtual seconds of the same stream run before the scored window, their requests
not scored: a service's steady state, not a cold engine's. What a cold start changes is
what the engine keeps: the prefix cache fills with the prefixes the workload repeats, and
multi-turn sessions grow their histories. SmolLM2's rag on 2 cores (2026-12-05) served
5.5 req/s for 40 s at a 0.60 prefix hit rate and 0 of 197 requests within the SLOs from a
fresh engine, at 0.82 and 143 completed after 40 s at 3 req/s: the real capacity search's
later probes run warm on one engine, so a cold simulated probe under-rated it 2.5x.

A warm-up starts cold, so at a rate near the knee it builds a queue that a continuing
window inherits; a real probe instead starts on an empty queue (the load client's stop
drops the previous load's backlog). With `lead` both measure the same state: the
warm-up's backlog is dropped, `lead` s at the load's rate build the window's own queue,
and the real probe runs its lead too (tuner/measure/capacity.measure_capacity). SmolLM2's
rag at 16 sequences (2026-12-05, 20-s lead and window): real 5.60 req/s, simulated 5.33;
without the lead the simulator said 4.30 (its warm-up's queue) and the real search 5.18
(a transient from an empty queue). Not the sweep's default yet (lead 0): at 4 sequences
the lead over-rated (3.60 simulated, 2.56 real), the simulator's 200-request warm-up being
warmer than the real search's, cut at one load (docs/benchmarks/tuning.md).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

from engine.kv_medium import Medium
from engine.sampling_params import SamplingParams
from tuner.measure.capacity import (SETTLED_FRACTION, SUSTAIN_SECONDS, CapacityResult, bracket,
                                    probe_verdict, search_capacity)
from tuner.measure.scoring import Samples, score
from tuner.sim.engine import SIM_VOCAB, sim_engine
from tuner.sim.profile import Profile
from tuner.sim.settle import Settling

KV_SAMPLE_EVERY = 4  # steps between samples of the pool's usage

TIERS = (Medium.CPU, Medium.DISK)   # the KV tiers below the pool whose hits are counted


@dataclass
class SimResult:
    samples: Samples
    figures: dict[str, float]
    schedule: list[tuple[tuple[str, int], ...]] = field(default_factory=list)  # kept on ask


def simulate(profile: Profile, settings: dict, stream, *, duration: float, slos: dict,
             hf_config, acceptance: float = 0.0, drafts=None, seed: int = 0,
             front: float = 0.0, warmup: float = 0.0, lead: float = 0.0,
             fresh: bool = False, keep_schedule: bool = False, engine=None, probe_for: float | None = None
             ) -> SimResult:
    """Run `stream` (tuner/sim/stream.py) for `warmup` + `duration` virtual seconds, scoring
    the requests that arrive after the warm-up. `engine`: an
    (LLMEngine, clock) pair to drive instead of the profiled one (tests drive the real
    model runner on a virtual clock through the same loop). `probe_for`: the run is a
    capacity probe for that attainment: it stops once its verdict is decided
    (tuner/sim/settle.py), and only its settled requests' records are complete.
    `drafts`: speculation per method (tuner/sim/engine.sim_engine). `lead` (with a
    warm-up): what the warm-up left running is dropped when it ends, and the stream runs
    `lead` s more, unscored, before the window: the real probe's twin with
    measure_capacity(lead=...) (the window finds a warm cache and its own rate's queue).
    `fresh` (with a warm-up, no lead): what the warm-up left running is dropped when it
    ends, so that the window starts from an empty queue and a warm cache, as a real probe
    does after the previous load drained (tuner/search/capacity_latency.py)."""
    if not duration > 0:
        raise ValueError(f"duration must be > 0 s, got {duration}")
    if not warmup >= 0:
        raise ValueError(f"the warm-up must be >= 0 s, got {warmup}")
    if not lead >= 0:
        raise ValueError(f"the lead must be >= 0 s, got {lead}")
    begin = warmup + lead          # the scored window: [begin, end]
    end = begin + duration
    settling = None if probe_for is None else Settling(
        slos, duration=duration, start=begin, front=front, give_up_below=probe_for,
        settled_arrivals=stream.arrivals_until(begin + SETTLED_FRACTION * duration)
        - (stream.arrivals_until(begin) if begin else 0))
    dropped = not (warmup and (lead or fresh))   # a warm-up's backlog dropped at its end
    wall = time.perf_counter()
    engine, clock = engine or sim_engine(profile, settings, hf_config=hf_config,
                                         acceptance=acceptance, drafts=drafts, seed=seed)
    vocab = engine.info.vocab_size
    live: dict[str, tuple] = {}   # request id -> (SimRequest, record, token times)
    records: list[dict] = []
    usage: list[float] = []
    schedule = []
    count = steps = 0
    cold = None                 # the engine's counters when the window began
    cold_tiers = dict.fromkeys(TIERS, 0)   # and the KV tiers' hits then
    warm_steps = 0
    totals = getattr(engine.runner, "totals", None)   # a profiled runner's step counters
    warm_totals = dict(totals or {})
    if keep_schedule:
        real_schedule = engine.scheduler.schedule

        def schedule_and_keep():
            batch = real_schedule()
            schedule.append(tuple((s.request_id, n) for s, n in
                                  zip(batch.seqs, batch.num_new_tokens)))
            return batch
        engine.scheduler.schedule = schedule_and_keep
    while True:
        if not dropped and clock.now >= warmup:
            # the warm-up filled the cache; what it left running is dropped, as the load
            # client's stop drops it before a real probe, and the lead builds the queue of
            # the window's own rate
            for rid in [rid for rid, (req, _, _) in live.items() if req.arrival < warmup]:
                engine.abort_request(rid)
                del live[rid]
            dropped = True
        while stream.next_time() <= min(clock.now, end):
            req = stream.pop()
            count += 1
            if req.refused:   # the server's 400: no engine work, a failed request
                stream.finished(req, 0)
                if req.arrival >= begin:
                    record = {"kind": req.kind, "start": req.arrival, "ok": False,
                              "error": f"HTTP 400: {req.refused}", "itl": [],
                              "prompt_tokens": len(req.prompt_ids), "output_tokens": 0}
                    records.append(record)
                    if settling:
                        settling.finished(record)
                continue
            rid = f"sim-{count}"
            ids = req.prompt_ids   # a trace's ids past the vocabulary wrap into it
            if ids and (max(ids) >= vocab or min(ids) < 0):
                ids = [t % vocab for t in ids]
            engine.add_request(rid, ids, SamplingParams(
                max_tokens=req.max_tokens, ignore_eos=True, temperature=0.0, detokenize=False),
                arrival_time=req.arrival)
            live[rid] = (req, {"kind": req.kind, "start": req.arrival, "ok": False,
                               "prompt_tokens": len(ids), "output_tokens": 0, "itl": []}, [])
        if clock.now >= end or (settling and settling.decided(live, clock.now)):
            break
        if not engine.has_unfinished_requests():
            clock.now = min(stream.next_time(), end)
            continue
        before = clock.now
        outputs = engine.step()
        steps += 1
        if len(usage) * KV_SAMPLE_EVERY <= steps - warm_steps and clock.now >= begin:
            usage.append(engine.kv.stats().usage)
        for req, record in collect(outputs, live, clock.now, front=front):
            stream.finished(req, record["output_tokens"])
            if req.arrival < begin:
                continue   # a warm-up or lead request: served, not scored
            records.append(record)
            if settling:
                settling.finished(record)
        if clock.now == before:   # nothing could run: wait for the next arrival
            clock.now = min(stream.next_time(), end)
        if begin and not cold and clock.now >= begin:
            cold, warm_steps = engine.get_stats(), steps   # the window's counters start here
            cold_tiers = {m: engine.kv.hits_by_medium.get(m, 0) for m in TIERS}
            warm_totals = dict(totals or {})
    stopped = min(clock.now, end)
    for rid, (req, record, times) in live.items():
        if req.arrival >= begin:
            record["error"] = "unfinished at end of run"
            records.append(record)
        engine.abort_request(rid)  # the client went away, as Locust's stop does
    stats = engine.get_stats()
    if cold:
        stats = dataclasses.replace(stats, **{
            name: getattr(stats, name) - getattr(cold, name) for name in
            ("prefix_cache_hits", "prefix_cache_queries", "num_preemptions", "evictions")})
    # prefix tokens the host and disk KV tiers served (tuner/sim/tiers.py), over the window
    tier_hits = {m: engine.kv.hits_by_medium.get(m, 0) - cold_tiers[m] for m in TIERS}
    samples = Samples(records=records, start=begin, stop=end)
    figures = score(samples, slos)
    figures.update(
        prefix_cache_hit_rate=stats.prefix_cache_hits / max(1, stats.prefix_cache_queries),
        server_preemptions=float(stats.num_preemptions),
        kv_cache_usage_perc_mean=sum(usage) / max(1, len(usage)),
        kv_cache_usage_perc_max=max(usage, default=0.0),
        num_blocks=float(engine.num_blocks), steps=float(steps - warm_steps),
        evictions=float(stats.evictions), stopped_at=stopped,
        gave_up=float(bool(settling and settling.failed)),
        sim_wall_s=time.perf_counter() - wall)
    # the window's summed step seconds and shape, as the engine's step counters give them
    figures.update({f"step_{name}": value - warm_totals[name]
                    for name, value in (totals or {}).items()})
    if engine.offload is not None:   # of the prompt tokens looked up, served by host memory
        figures["host_tier_hit_rate"] = tier_hits[Medium.CPU] / max(
            1, stats.prefix_cache_queries)
    if engine.offload is not None and engine.offload.disk is not None:   # ... by the disk
        figures["disk_tier_hit_rate"] = tier_hits[Medium.DISK] / max(
            1, stats.prefix_cache_queries)
    if engine.spec_stats.num_draft_tokens:   # as a real trial reports it (server_metrics)
        figures["spec_acceptance_rate"] = engine.spec_stats.acceptance_rate
    return SimResult(samples, figures, schedule)


def collect(outputs, live: dict, now: float, *, front: float = 0.0) -> list[tuple]:
    """One step's outputs into the running requests' records: each new token timed at
    `now`; a finished request leaves `live` (request id -> (request, record, token
    times)) with its record completed (TTFT and E2E plus `front`, inter-token gaps,
    tokens, `done`). The gaps are between the steps that delivered tokens, as a real
    client's are between streamed chunks (a step's accepted drafts arrive in one chunk);
    TPOT divides their sum by the tokens (tuner/measure/scoring.tpot), both sides alike.
    -> [(request, record)] of those that finished."""
    finished = []
    for out in outputs:
        req, record, times = live[out.request_id]
        times += [now] * (len(out.outputs[0].token_ids) - len(times))
        if out.finished:
            del live[out.request_id]
            record.update(ok=True, ttft=times[0] - req.arrival + front,
                          e2e=now - req.arrival + front, output_tokens=len(times),
                          itl=[b - a for a, b in zip(times, times[1:]) if b > a], done=now)
            finished.append((req, record))
    return finished


def front_seconds(real: list[dict], simulated: list[dict]) -> float:
    """The time outside the engine's steps: the median TTFT of a real run's completed
    requests less that of the simulated run of the same stream (simulated without it), at
    least 0. ValueError when either run completed no request."""
    medians = []
    for name, records in (("real", real), ("simulated", simulated)):
        ttfts = [r["ttft"] for r in records if r.get("ok") and r.get("ttft") is not None]
        if not ttfts:
            raise ValueError(f"the {name} run completed no request: no TTFT to compare")
        medians.append(statistics.median(ttfts))
    return max(0.0, medians[0] - medians[1])


def sim_capacity(run_at, slos: dict, *, start: float = 1.0, attainment: float = 0.9,
                 rel_tol: float = 0.05, max_probes: int = 16,
                 growth: float = 2.0, sustain: float = SUSTAIN_SECONDS) -> CapacityResult:
    """The capacity search (tuner/measure/capacity.py) with `run_at(rate, probe)` a
    simulated load at that rate (a SimResult; `probe`: stopped once its verdict is
    decided). A probe stopped early as a failure records its share so far; when it ends
    up as the lowest failing rate above the highest passing one, whose share
    capacity.interpolated reads, it is run again in full."""
    runs: dict[float, SimResult] = {}

    def probe(rate: float):
        runs[rate] = run_at(rate, True)
        return runs[rate].samples
    result = search_capacity(probe, slos, start=start, attainment=attainment,
                             rel_tol=rel_tol, max_probes=max_probes, growth=growth,
                             sustain=sustain)
    _, top = bracket(result)
    if top is not None and runs[top["rate"]].figures.get("gave_up"):
        top.update(probe_verdict(run_at(top["rate"], False).samples, slos, attainment,
                                 sustain),
                   rerun=True)
    return result


__all__ = ["SIM_VOCAB", "SimResult", "collect", "front_seconds", "sim_capacity", "simulate"]
