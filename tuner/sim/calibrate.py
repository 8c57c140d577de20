"""`python -m tuner profile`: time the engine's own steps on this machine and fit a profile.

The calibration drives an in-process engine (the real model runner, the real scheduler)
through batches chosen to spread the step shapes the simulator will ask about: single
prompts of growing length (prefills, chunked past the token budget), decode batches of
growing size at short and long contexts, and a mixed phase where prompts arrive while
others decode (chunked prefill beside decodes). Each step is timed by the engine itself
(LLMEngine.step_observer: scheduling, model, sampling and output processing). A last
phase decodes batches that verify a fixed number of drafts per row (1, 3 or 8; a
proposer that always offers them, FixedDrafts), then batches whose n-gram lookups find
nothing in random prompts, so that a profile prices what speculation costs (per draft,
per row that verifies any, per row looked up in vain) before any service ever
speculated (at the first block size only). The first steps of each engine (warm-up) are
not used. Profiles are cached per identity and CALIBRATION (what the phases time) under
$PAGED_PROFILE_DIR (default ~/.cache/paged-inference/profiles).
"""
from __future__ import annotations

import hashlib
import math
import os
import platform
import random
import time
from pathlib import Path

from engine.step_shape import StepShape
from tuner.sim.profile import UNFITTED, Fit, Identity, Memory, Profile, fit

WARMUP_STEPS = 3
CALIBRATION = 2   # 2: the draft and lookup phases; a profile cached by an older one is not reused
DRAFT_PHASES = ((1, 1), (1, 8), (4, 3), (16, 1), (16, 3), (16, 8))  # (rows, drafts per row)
LOOKUP_PHASES = ((1, 384), (4, 32), (4, 512), (16, 128))   # (rows, prompt tokens)


class FixedDrafts:
    """A Proposer (engine/spec_decode/proposer.py) that offers `k` copies of `token` every
    step (as many as the scheduler leaves room for): verification timed at a known width,
    whatever the model would accept."""

    def __init__(self, k: int, token: int = 3) -> None:
        self.num_speculative_tokens, self.token = k, token

    def draft(self, seq, room: int, batch_size: int) -> list[int]:
        return [self.token] * min(self.num_speculative_tokens, room)

    def finished(self, seq) -> None:
        pass


def profile_dir() -> Path:
    return Path(os.environ.get("PAGED_PROFILE_DIR") or
                Path.home() / ".cache" / "paged-inference" / "profiles")


def hardware() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} x{os.cpu_count()}"


def identity(model: str | None, threads: int) -> Identity:
    import torch

    from engine.model_loader import resolve_model_path

    path = resolve_model_path(model)
    config = (Path(path) / "config.json").read_bytes()
    return Identity(model=model or "builtin://default",
                    fingerprint=hashlib.sha256(config).hexdigest(), hardware=hardware(),
                    torch=torch.__version__.split("+")[0], threads=threads)


def config_profile(model: str | None, threads: int) -> Profile:
    """A profile of `model` that times nothing: its identity, and from its config.json the
    KV bytes per token (2-byte dtype), context length and vocabulary; its fit is UNFITTED
    until one comes from the service's own steps (tuner/sim/live_profile.live_profile).
    The SLO planner starts from it where no calibration is cached: it runs beside the
    service, not on the service's hardware, and a calibration there would time the wrong
    machine for minutes."""
    import json

    from engine.kv_capacity import KVShape
    from engine.model_loader import resolve_model_path

    config = json.loads((Path(resolve_model_path(model)) / "config.json").read_text())
    text = config.get("text_config") or config
    memory = Memory(device_bytes=0.0, weight_bytes=0.0,
                    kv_bytes_per_token=KVShape.of(text).bytes_per_token(2),
                    activation_base=0.0, activation_per_token=0.0,
                    max_model_len=int(text.get("max_position_embeddings") or 2048),
                    vocab_size=int(text["vocab_size"]),
                    activation_per_seq=float(int(text["vocab_size"]) * (2 + 4)))
    return Profile(identity(model, threads), Fit(UNFITTED, {}, math.inf), memory, 0,
                   "from config.json: no step-time fit")


def cached_path(ident: Identity) -> Path:
    return profile_dir() / f"{ident.key()}-cal{CALIBRATION}.json"


def _phases(rng: random.Random, vocab: int, max_len: int, scale: float):
    """(prompt lengths, max_tokens, arrivals per step) of each phase; `scale` < 1 makes a
    quick calibration (tests)."""
    n = max(1, round(8 * scale))
    prefill = [(L, 2) for L in (16, 64, 256, 512, 1024, 1536) if L < max_len - 4]
    phases = [[p] for p in prefill * max(1, round(2 * scale))]
    for batch in (1, 2, 4, 8, 16, 32, 64):
        for ctx in (16, 384):
            phases.append([(ctx, n + 4)] * batch)
    mixed = [(rng.randint(16, min(768, max_len - 40)), rng.randint(4, 32))
             for _ in range(max(6, round(48 * scale)))]
    phases.append(mixed)
    return phases


def run_calibration(model: str | None, *, threads: int = 1, block_sizes=(16, 64),
                    max_num_batched_tokens: int = 1024, scale: float = 1.0, seed: int = 0,
                    log=print) -> Profile:
    """Time steps at each block size, fit, and return the profile (not saved)."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    rng = random.Random(seed)
    shapes: list[StepShape] = []
    seconds: list[float] = []
    memory = None
    for block_size in block_sizes:
        engine = LLMEngine(EngineConfig(
            model=model, block_size=block_size, max_num_seqs=64, cpu_threads=threads,
            max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False,
            num_gpu_blocks_override=64 * 2048 // block_size, seed=seed,
            speculative_config={"method": "ngram", "num_speculative_tokens": max(
                k for _, k in DRAFT_PHASES)}))
        ngram, engine.scheduler.proposer = engine.scheduler.proposer, None  # drafts: below
        vocab, max_len = engine.info.vocab_size, engine.info.max_model_len
        timed: list[tuple[StepShape, float]] = []
        engine.step_observer = lambda shape, s: timed.append((shape, s))
        started, count = time.monotonic(), 0
        for phase in _phases(rng, vocab, max_len, scale):
            for prompt_len, out in phase:
                count += 1
                ids = [rng.randrange(3, vocab) for _ in range(prompt_len)]
                engine.add_request(f"cal-{count}", ids, SamplingParams(
                    max_tokens=out, ignore_eos=True, temperature=0.0))
                if len(phase) > 8 and count % 3 == 0:  # the mixed phase: arrivals mid-run
                    engine.step()
            while engine.has_unfinished_requests():
                engine.step()
        # decodes verifying k drafts per row, then decodes whose n-gram lookups (random
        # prompts) mostly find nothing; prompts of at most 512 tokens (a 135M model
        # prefills ~2.5 ms per token on one thread; the context's cost is the decode
        # phases' to time). At the first block size only: their terms are per row and per
        # draft, the block size's cost is the other phases' to time, and on SmolLM2 they
        # take about a minute per block size
        speculative = block_size == block_sizes[0]
        spec_phases = []
        if speculative:
            spec_phases = ([(FixedDrafts(k), rows, rng.choice((32, 256)))
                            for rows, k in DRAFT_PHASES]
                           + [(ngram, rows, min(length, max_len - 40))
                              for rows, length in LOOKUP_PHASES])
        for proposer, rows, length in spec_phases:
            engine.scheduler.proposer = proposer
            for _ in range(rows):
                count += 1
                ids = [rng.randrange(3, vocab) for _ in range(length)]
                engine.add_request(f"cal-{count}", ids, SamplingParams(
                    max_tokens=max(4, round(8 * scale)) + 8, ignore_eos=True,
                    temperature=0.0))
            while engine.has_unfinished_requests():
                engine.step()
        engine.scheduler.proposer = None
        shapes += [s for s, _ in timed[WARMUP_STEPS:]]
        seconds += [t for _, t in timed[WARMUP_STEPS:]]
        log(f"block_size {block_size}: {len(timed)} steps timed in "
            f"{time.monotonic() - started:.1f} s"
            + (" (with the draft and lookup phases)" if speculative else ""))
        if memory is None:
            memory = _memory(engine, max_num_batched_tokens)
        del engine
    result = fit(shapes, seconds)
    log(f"form {result.form}: held-out median error {result.heldout_error:.1%} "
        f"(" + ", ".join(f"{k} {v:.1%}" for k, v in result.errors.items()) + ")")
    return Profile(identity(model, threads), result, memory, len(shapes),
                   created=time.strftime("%Y-%m-%d %H:%M:%S"))


def logits_bytes_per_seq(vocab_size: int, dtype) -> float:
    """What one sequence's logits add to the engine's profiling forward: the model's
    output row in its dtype, and the float32 copy the runner returns (none when the model
    runs in float32, as on a CPU)."""
    import torch

    size = torch.empty((), dtype=dtype).element_size()
    return float(vocab_size * (size + (4 if size != 4 else 0)))


def _memory(engine, tokens: int) -> Memory:
    """The pool's terms: weights and KV bytes from the runner; activations from two of the
    runner's own profiling forwards (the ones it sizes the pool with at start-up)."""
    runner = engine.runner
    small, large = 128, max(256, tokens)
    a_small = runner.profile_peak_activation_bytes(small, 1)
    a_large = runner.profile_peak_activation_bytes(large, 1)
    per_token = max(0.0, (a_large - a_small) / (large - small))
    per_seq = logits_bytes_per_seq(engine.info.vocab_size, runner.dtype)
    runner.allocate_kv_cache(engine.num_blocks)  # the probes dropped the pool's views
    from tuner.sim.tiers import time_copies

    store, load, disk = time_copies(runner.kv_bytes_per_block, pool=runner.kv_pool)
    return Memory(device_bytes=float(runner.device_memory_bytes()) if runner.device.type
                  == "cuda" else 0.0,
                  weight_bytes=float(runner.weight_bytes()),
                  kv_bytes_per_token=runner.kv_bytes_per_block // engine.info.block_size,
                  activation_base=max(0.0, a_small - per_token * small - per_seq),
                  activation_per_token=per_token, max_model_len=engine.info.max_model_len,
                  vocab_size=engine.info.vocab_size, activation_per_seq=per_seq,
                  store_seconds_per_byte=store, load_seconds_per_byte=load,
                  disk_load_seconds_per_byte=disk)
