"""One replica's SLO capacity at the service's current mix, from the profile and simulator.

The mix is the workload fitted from the service's own histograms over the planner's window
(tuner/sources/histogram.py: prompt and output lengths by bucket); a trace of it runs
through the simulated engine (the engine's own scheduler, tuner/sim) with the service's
settings: its capacity by bisection on rate, and the median inter-token latency at the
rate each replica receives now (what the planner's correction compares with the observed
one). A mix is simulated once: predictions are remembered by the mix's bucket shares,
rounded to MIX_RESOLUTION.

With `live` (a LiveSteps), the profile is the service's own: before each prediction the
step counters the engines export (paged:engine_step_*, as Prometheus scraped them) since
the last reading are added to a rolling series, and the step-time fit is refitted from it
once it holds enough busy windows; the KV pool is the engines' own size
(vllm:cache_config_info's num_gpu_blocks, the smallest of the pods). For a speculative
service its drafts are its own too: its vllm:spec_decode_* counters over the series'
window (LiveSteps.drafts) replace acceptance 0 once they count MIN_DRAFT_STEPS decode
rows. Each change drops the remembered capacities. The mix's trace loops (TraceStream),
so a probe faster than the trace lasts stays loaded.
"""
from __future__ import annotations

import dataclasses

from tuner.measure.promql import PrometheusError
from tuner.planner.core import Prediction
from tuner.sim.context import SimContext
from tuner.sim.drafts import DraftModel, from_counters
from tuner.sim.live_profile import Totals, live_profile, prometheus_series
from tuner.sim.profile import UNFITTED, Profile
from tuner.sources.histogram import FittedWorkload

MIX_RESOLUTION = 0.05      # bucket shares rounded to 5 %: a mix that moves less is the same
TRACE_REQUESTS = 400       # requests in the simulated trace of a mix
MIN_DRAFT_STEPS = 200      # decode steps before the service's own drafts replace acceptance 0
DRAFT_RESOLUTION = 0.02    # tokens per step and share drafting, rounded: a model that moves
                           # less is the same


def mix_key(fitted: FittedWorkload) -> tuple:
    def shares(d):
        return d.edges, tuple(round(c / d.total / MIX_RESOLUTION) for c in d.counts)
    return shares(fitted.prompt), shares(fitted.output)


class LiveSteps:
    """The service's step counters read back from Prometheus every `every` s, the last
    `history` s of them kept."""

    def __init__(self, reader, selector: str, *, every: float = 15.0,
                 history: float = 1800.0) -> None:
        self.reader, self.sel = reader, "{" + selector + "}"
        self.every, self.history = every, history
        self.readings: list[Totals] = []
        self.why = "no step series read yet"

    def update(self, at: float, base: Profile) -> tuple[Profile | None, int | None]:
        """(base refitted from the series when it grew and holds enough busy windows,
        else None; the engines' KV blocks, else None)."""
        start = self.readings[-1].t + self.every if self.readings else at - self.history
        new: list[Totals] = []
        if start <= at:
            try:
                new = prometheus_series(self.reader, self.sel, start=start, end=at,
                                        interval=self.every)
            except (ValueError, PrometheusError) as exc:
                self.why = str(exc)
        self.readings = [r for r in self.readings + new if r.t >= at - self.history]
        profile = None
        if new:
            try:
                profile = live_profile(base, self.readings)
            except ValueError as exc:
                self.why = str(exc)
        return profile, self._blocks(at)

    def drafts(self, at: float, spec: dict) -> DraftModel | None:
        """The service's speculation over the last `history` s as a DraftModel (tuner/sim/
        drafts.from_counters) of its method `spec` (a speculative_config), from the engines'
        vllm:spec_decode_* counters and their decode rows; None before MIN_DRAFT_STEPS
        decode steps, or without Prometheus."""
        inner = self.sel[1:-1]
        rows = "{" + ",".join(x for x in ('figure="decode_seqs"', inner) if x) + "}"
        window = f"[{max(1, int(self.history))}s]"
        try:
            def total(series: str, sel: str = self.sel) -> float:
                return self.reader.scalar(f"sum(increase({series}{sel}{window}))", at=at) or 0.0
            steps = total("paged:engine_step_shape_total", rows)
            if steps < MIN_DRAFT_STEPS:
                return None
            per_pos = self.reader.query(
                f"sum by (position) (increase("
                f"vllm:spec_decode_num_accepted_tokens_per_pos_total{self.sel}{window}))", at=at)
            accepted = [0.0] * spec["num_speculative_tokens"]
            for labels, value in per_pos:
                pos = int(labels.get("position", -1))
                if 0 <= pos < len(accepted):
                    accepted[pos] = value
            return from_counters(spec.get("method", "ngram"), spec["num_speculative_tokens"],
                                 steps=steps, drafts=total("vllm:spec_decode_num_drafts_total"),
                                 draft_tokens=total("vllm:spec_decode_num_draft_tokens_total"),
                                 accepted_per_pos=accepted)
        except PrometheusError as exc:
            self.why = str(exc)
            return None

    def _blocks(self, at: float) -> int | None:
        try:
            # over the last minute: one failed scrape marks the series stale, and the
            # pool does not change with it
            found = self.reader.query(f"last_over_time(vllm:cache_config_info{self.sel}[1m])",
                                      at=at)
        except PrometheusError:
            return None
        sizes = [int(labels["num_gpu_blocks"]) for labels, _ in found
                 if str(labels.get("num_gpu_blocks", "")).isdigit()]
        return min(sizes) if sizes else None


def _draft_key(model: DraftModel | None) -> tuple | None:
    if model is None:
        return None
    return (round(model.tokens_per_step / DRAFT_RESOLUTION),
            round(model.draft_share / DRAFT_RESOLUTION))


class SimPredictor:
    def __init__(self, ctx: SimContext, settings: dict, *, live: LiveSteps | None = None) -> None:
        """`ctx`: a SimContext whose profile and SLOs are the service's (its trace is set
        per mix); `settings`: the service's engine settings; `live`: the service's own
        step series (else the profile's fit stands)."""
        self.ctx, self.settings, self.live = ctx, settings, live
        self._capacity: dict[tuple, float] = {}
        self._itl: dict[tuple, float | None] = {}   # by (mix, per-replica rate)

    def refresh(self, at: float) -> None:
        """The service's own steps and KV pool, when `live` has them (see the module)."""
        if self.live is None:
            return
        profile, blocks = self.live.update(at, self.ctx.profile)
        if profile is not None:
            self.ctx = dataclasses.replace(self.ctx, profile=profile, _loaded=self.ctx._loaded)
            self._capacity.clear()
            self._itl.clear()
        if blocks is not None and blocks != self.settings.get("num_gpu_blocks_override"):
            self.settings = {**self.settings, "num_gpu_blocks_override": blocks}
            self._capacity.clear()
            self._itl.clear()
        spec = self.settings.get("speculative_config")
        model = self.live.drafts(at, spec) if spec else None
        if model is not None and _draft_key(model) != _draft_key(self.ctx.drafts_given):
            # the service's own drafts and acceptance replace acceptance 0
            self.ctx = dataclasses.replace(self.ctx, acceptance=None, drafts_given=model,
                                           _loaded=self.ctx._loaded)
            self._capacity.clear()
            self._itl.clear()

    def __call__(self, fitted: FittedWorkload, per_replica_rate: float) -> Prediction:
        if self.ctx.profile.fit.form == UNFITTED:
            why = self.live.why if self.live is not None else "no step series is read"
            raise ValueError(f"no step-time profile yet ({why}): the planner fits one from "
                             "the service's own steps (paged:engine_step_*) once they hold "
                             "enough busy windows, or `python -m tuner profile --model M` "
                             "on the service's hardware caches one")
        # the mix, not the rate, decides the capacity: synthesise enough requests of it
        nominal = dataclasses.replace(fitted, rate=max(fitted.rate, 1.0))
        trace = nominal.synthesize(TRACE_REQUESTS / nominal.rate, seed=0)
        ctx = dataclasses.replace(self.ctx, trace=trace, workload=None, loop_trace=True,
                                  _loaded=self.ctx._loaded)
        key = mix_key(fitted)
        if key not in self._capacity:
            result = ctx.capacity(self.settings)
            self._capacity[key] = result.rate

        def itl_at(rate: float) -> float | None:
            """The simulated median inter-token latency at this per-replica rate (to two
            digits: the correction's solve asks for nearby rates again)."""
            rate = float(f"{rate:.2g}")
            if (key, rate) not in self._itl:
                self._itl[key, rate] = ctx.run(self.settings, rate).figures.get("itl_p50")
            return self._itl[key, rate]
        itl = itl_at(per_replica_rate) if per_replica_rate > 0 else None
        return Prediction(capacity=self._capacity[key], itl_p50=itl, itl_at=itl_at)
