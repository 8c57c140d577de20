"""The machine's speed at one moment, against a step-time profile: a fixed set of engine
steps run in this process and timed, over what the profile prices the same steps at
(1.0: the steps take what they took when the profile was calibrated; 1.3: 30 % longer).

A benchmark that compares real runs made over half an hour (bench_sim_fidelity --speed)
reads it before each real measurement. This 2-core VM's speed moves by up to 2x within
twenty minutes (docs/benchmarks/tuning.md), which a simulator calibrated once cannot
follow: a capacity measured while the machine ran 20 % slower than at the pilot is no
evidence against the simulator, and the index says which real runs were measured so.
It times the engine's own steps (model, scheduler, sampler, outputs: what a served step
also runs), not a micro-benchmark of one of them.
"""
from __future__ import annotations

import itertools
import random
import statistics

from scipy.stats import kendalltau

from benchmarks.sim_fidelity_grids import DEFAULTS, rel

# (requests, prompt tokens, output tokens): long prefills, then a batch of decodes
PHASES = ((4, 512, 8), (16, 64, 24))
REPEATS = 3          # the index is the median of this many passes over the phases
POOL_TOKENS = 16_384


class SpeedIndex:
    """One engine of `model` in this process (loaded once); measure() times PHASES on it."""

    def __init__(self, profile, *, model: str | None = None, threads: int = 1,
                 seed: int = 0) -> None:
        from engine.config import EngineConfig
        from engine.llm_engine import LLMEngine

        self.profile, self.seed = profile, seed
        self.engine = LLMEngine(EngineConfig(
            model=model, block_size=16, max_num_seqs=16, cpu_threads=threads,
            max_num_batched_tokens=1024, enable_prefix_caching=False, seed=seed,
            num_gpu_blocks_override=POOL_TOKENS // 16))
        self.timed: list = []
        self.engine.step_observer = lambda shape, seconds: self.timed.append((shape, seconds))
        self._ids = itertools.count()
        self.one_pass()   # the first steps after a start run slow: not counted

    def one_pass(self) -> float:
        """The phases once: their steps' seconds over the profile's price for them."""
        from engine.sampling_params import SamplingParams

        self.timed.clear()
        rng = random.Random(self.seed)   # the same prompts every pass
        vocab = self.engine.info.vocab_size
        for count, prompt, out in PHASES:
            for _ in range(count):
                ids = [rng.randrange(3, vocab) for _ in range(prompt)]
                self.engine.add_request(f"speed-{next(self._ids)}", ids, SamplingParams(
                    max_tokens=out, ignore_eos=True, temperature=0.0, detokenize=False))
            while self.engine.has_unfinished_requests():
                self.engine.step()
        return index(self.timed, self.profile.step_seconds)

    def measure(self, repeats: int = REPEATS) -> float:
        return statistics.median(self.one_pass() for _ in range(repeats))


def index(timed: list, price) -> float:
    """Timed steps [(shape, seconds)] over what `price(shape)` says they cost."""
    if not timed:
        raise ValueError("no steps were timed")
    return sum(s for _, s in timed) / sum(price(shape) for shape, _ in timed)


def at_speed(capacity: float, speed: float, reference: float) -> float:
    """A capacity measured at machine speed `speed`, as it would read at `reference`
    (both indexes of one profile): capacity scales with the inverse of step time, so a
    run measured while steps took 20 % longer (1.2 against 1.0) is read 1.2x higher."""
    if not (speed > 0 and reference > 0):
        raise ValueError(f"speed indexes must be > 0, got {speed} and {reference}")
    return capacity * speed / reference


def speed_report(rows: list[dict], light: dict, labels: list[str]) -> str:
    """bench_sim_fidelity's rows read at the pilot's speed: each setting's speed, each
    profile's median capacity error and Kendall tau against the real capacities at the
    pilot's speed (at_speed), and where the grid holds the defaults (the pilot's setting)
    how much of the two measurements' gap the speed explains."""
    ref = light["speed"]
    fixed = [at_speed(r["real_cap"], r["speed"], ref) for r in rows]
    lines = [f"\nmachine speed (step time over the profile's): pilot {ref:.3f}; settings "
             + ", ".join(f"{r['speed']:.3f}" for r in rows)]
    for label in labels:
        sim = [r[f"{label}_cap"] or 0.0 for r in rows]
        err = statistics.median(e for a, b in zip(sim, fixed) if (e := rel(a, b)) is not None)
        lines.append(f"  {label} against the real capacities at the pilot's speed: "
                     f"capacity error {err:.1%}, Kendall tau "
                     f"{kendalltau(sim, fixed).statistic:.2f}")
    pilot = light.get("pilot_capacity")
    for r, f in zip(rows, fixed):
        if pilot and r["settings"] == DEFAULTS:
            lines.append(f"  the defaults: the pilot {pilot:.2f} req/s, again in the grid "
                         f"{r['real_cap']:.2f} ({r['real_cap'] / pilot:.2f}x), at the "
                         f"pilot's speed {f:.2f} ({f / pilot:.2f}x)")
    return "\n".join(lines)
