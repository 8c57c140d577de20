"""What a simulated trial needs once per sweep: the model's tokenizer and config, the
profile (cached per identity, or calibrated now), the request stream's source and SLOs.

`SimContext.capacity(settings)` is one setting's SLO capacity: the capacity search
(tuner/measure/capacity.py) over simulated loads, every load replaying the same seeded
stream (common random numbers, so settings differ by what they do, not by their luck).

Speculative settings are simulated per method (tuner/sim/drafts.py): the first one asks
the real engine for the model's replies to the stream's first REPLY_REQUESTS requests
(once per context), and each method and length is replayed over them once. A fixed
`acceptance` instead keeps the engine's own proposer over made-up tokens, every draft
accepted at that rate.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

from tuner.measure.capacity import SUSTAIN_SECONDS, CapacityResult
from tuner.sim.profile import Profile
from tuner.sim.simulate import SimResult, sim_capacity, simulate
from tuner.sim.stream import Renderer, TraceStream, WorkloadStream

# virtual seconds per simulated load: the real capacity probes' window (tuner/arguments.py's
# DEFAULT_DURATION), so a simulated capacity is the figure a real search reads
DEFAULT_SIM_DURATION = 10.0
# requests of a workload's stream served before each simulated load's scored window: its
# steady state (tuner/sim/simulate.py). SmolLM2's rag, simulated capacity of the defaults
# by warm-up: 0 2.11, 50 2.87, 100 3.52, 200 4.20, 400 4.38 req/s (2026-12-05)
SIM_WARMUP_REQUESTS = 200
START_RATE = 1.0
REPLY_REQUESTS = 48           # the workload's requests whose real replies drafts replay


def engine_threads(settings: dict) -> int:
    """The CPU threads the engine runs with: its cpu_threads setting, else torch's
    default (OMP_NUM_THREADS, else one per core)."""
    return int(settings.get("cpu_threads") or os.environ.get("OMP_NUM_THREADS")
               or os.cpu_count() or 1)


def load_profile(model: str | None, threads: int, *, path: str | None = None,
                 log=lambda s: print(s, file=sys.stderr), calibrate: bool = True) -> Profile:
    """The profile at `path` (refused when measured for another model or thread count),
    else the cached one for this identity, else a calibration now (cached for next time)."""
    from tuner.sim.calibrate import cached_path, identity, run_calibration

    ident = identity(model, threads)
    if path is not None:
        return Profile.load(path, expect=ident)
    cached = cached_path(ident)
    if cached.exists():
        profile = Profile.load(cached, expect=ident)
        if profile.memory.disk_load_seconds_per_byte is None:   # cached before copies were timed
            time_host_copies(profile)
            profile.save(cached)
        return profile
    if not calibrate:
        raise ValueError(f"no profile for {ident.model} with {threads} thread(s) at {cached}; "
                         f"run `python -m tuner profile --model {ident.model}`")
    log(f"profile: none cached for {ident.model} ({threads} thread(s), {ident.hardware}); "
        "calibrating on this machine (python -m tuner profile)")
    profile = run_calibration(model, threads=threads, log=log)
    profile.save(cached)
    log(f"profile: written to {cached}")
    return profile


def time_host_copies(profile: Profile) -> None:
    """The KV tiers' copy rates (tuner/sim/tiers.py) the profile lacks, timed now on a pool
    of this model's block bytes: it was calibrated before they were part of it."""
    from tuner.sim.tiers import time_copies

    memory = profile.memory
    timed = time_copies(memory.kv_bytes_per_token * 16)
    for name, value in zip(("store_seconds_per_byte", "load_seconds_per_byte",
                            "disk_load_seconds_per_byte"), timed):
        if getattr(memory, name) is None:   # the calibration's own rates stay
            setattr(memory, name, value)


@dataclass
class SimContext:
    profile: Profile
    slos: dict
    workload: object | None = None        # a WorkloadSpec, or
    trace: list | None = None             # a trace's requests
    users: int = 4
    length_scale: float = 1.0
    duration: float = DEFAULT_SIM_DURATION
    warmup_requests: int = 0              # the stream's first requests, served, not scored
    lead: float = 0.0                     # s at the load's rate after them, not scored
    seed: int = 0
    acceptance: float | None = None       # None: per method, replayed on real replies
    attainment: float = 0.9
    sustain: float = SUSTAIN_SECONDS      # s a passing rate's queue must hold (capacity.py)
    model: str | None = None
    front_seconds: float = 0.0            # time outside the engine's steps (simulate.py)
    replies: list | None = None           # tuner/sim/drafts.Reply, made on first use
    drafts_given: object | None = None    # a DraftModel for every method (a service's own)
    loop_trace: bool = False              # the trace restarts once replayed (TraceStream)
    log: object = field(default=lambda s: print(s, file=sys.stderr), repr=False)
    _loaded: dict = field(default_factory=dict, repr=False)
    _drafts: dict = field(default_factory=dict, repr=False)

    def _model_parts(self):
        if not self._loaded:
            from transformers import AutoConfig, AutoTokenizer

            from engine.model_loader import resolve_model_path
            path = resolve_model_path(self.model)
            self._loaded.update(render=Renderer(AutoTokenizer.from_pretrained(path)),
                                hf_config=AutoConfig.from_pretrained(path))
        return self._loaded["render"], self._loaded["hf_config"]

    def stream(self, rate: float | None):
        render, _ = self._model_parts()
        max_len = self.profile.memory.max_model_len
        if self.trace is not None:
            return TraceStream(self.trace, rate=rate, seed=self.seed, loop=self.loop_trace,
                               length_scale=self.length_scale, max_model_len=max_len)
        return WorkloadStream(self.workload, rate=rate or 1.0, users=self.users, render=render,
                              seed=self.seed, length_scale=self.length_scale,
                              max_model_len=max_len)

    @property
    def replays_drafts(self) -> bool:
        """Speculative settings replay their method on the model's replies (no fixed
        acceptance, no DraftModel measured on a service)."""
        return self.acceptance is None and self.drafts_given is None

    def prepare_replies(self) -> None:
        """The model's replies that speculative settings replay, run once (the first
        speculative setting's draft_model runs it otherwise). The sweep calls it before it
        forks its simulator workers (tuner/search/sim_pool.py), so they inherit one set of
        replies instead of each running the model for its own."""
        from tuner.sim.drafts import model_replies

        if self.replies is not None:
            return
        stream = self.stream(1.0)
        requests = []
        for _ in range(REPLY_REQUESTS):
            requests.append(stream.pop())
            stream.finished(requests[-1], requests[-1].max_tokens)
        started = time.perf_counter()
        self.replies = model_replies(self.model, requests, seed=self.seed)
        self.log(f"simulator: the model's replies to {len(requests)} requests, for the "
                 f"drafts of speculative settings ({time.perf_counter() - started:.1f} s)")

    def prepare_drafts(self, settings: list[dict]) -> None:
        """The replies and every speculative setting's drafts among `settings`, replayed
        now (the sweep calls it before it forks its workers, which then share them and
        report each replay once, not once per worker)."""
        from tuner.sim.engine import engine_config

        self.prepare_replies()
        for one in settings:
            try:
                spec = engine_config(one).speculative_config
            except ValueError:   # refused: its simulation says why, in its worker
                continue
            if spec:
                self.draft_model(spec)

    def draft_model(self, spec: dict):
        """The DraftModel of a speculative_config on this workload (tuner/sim/drafts.py)."""
        from tuner.sim.drafts import drafting_key, replay

        if self.drafts_given is not None:   # measured on the service (tuner/planner)
            return self.drafts_given
        self.prepare_replies()
        key = drafting_key(spec)
        if key not in self._drafts:
            model = self._drafts[key] = replay(spec, self.replies)
            self.log(f"simulator: {model.method} k={spec['num_speculative_tokens']} on the "
                     f"model's replies: {model.draft_share:.0%} of {model.steps} decode steps "
                     f"draft, acceptance by position "
                     f"{' '.join(f'{a:.2f}' for a in model.accept)}, "
                     f"{model.tokens_per_step:.2f} tokens per step")
        return self._drafts[key]

    def run(self, settings: dict, rate: float | None, *, probe: bool = False,
            duration: float | None = None, fresh: bool = False) -> SimResult:
        """One simulated load (`duration`: its window, this context's by default);
        `probe`: a capacity probe, stopped once its verdict at this context's attainment is
        decided (tuner/sim/settle.py); `fresh`: the warm-up's backlog is dropped before the
        window (tuner/sim/simulate.py)."""
        _, hf_config = self._model_parts()
        per_method = self.acceptance is None
        # a workload's steady state (a trace replays from its own beginning)
        warmup = self.warmup_requests / rate if self.trace is None and rate else 0.0
        return simulate(self.profile, settings, self.stream(rate),
                        duration=duration or self.duration,
                        slos=self.slos, hf_config=hf_config, acceptance=self.acceptance or 0.0,
                        drafts=self.draft_model if per_method else None,
                        seed=self.seed, front=self.front_seconds, warmup=warmup,
                        lead=self.lead if warmup else 0.0, fresh=fresh,
                        probe_for=self.attainment if probe else None)

    def capacity(self, settings: dict, *, start: float = START_RATE, rel_tol: float = 0.05,
                 max_probes: int = 16, growth: float = 2.0) -> CapacityResult:
        """ValueError for settings the engine would refuse (the search's infeasible)."""
        return sim_capacity(lambda rate, probe: self.run(settings, rate, probe=probe),
                            self.slos, start=start, attainment=self.attainment, rel_tol=rel_tol,
                            max_probes=max_probes, growth=growth, sustain=self.sustain)
