"""The engine in virtual time: the real LLMEngine (its scheduler, KV cache manager, step
loop, sampler and output processing) with the model runner replaced by a profile.

`ProfiledRunner` answers what engine/model_runner.ModelRunner answers. Its `execute`
advances a virtual clock by the profile's time for the batch's shape and returns logits
(RowTokens: each row's token, which ProfiledSampler reads without the arithmetic over the
vocabulary) that make the sampler pick a token of its choosing: a fresh pseudo-random one per row
(a model writing new text), and for a speculative row each draft accepted with the given
probability (one for every position, or one per position: draft j given drafts 1..j-1
were accepted), in order, up to the first rejection. With a DraftModel (tuner/sim/
drafts.py) the drafts themselves come from a ModelledProposer: as often and as long as the
method drafts on the model's own replies, accepted at its per-position rates. The engine
reads that clock for every timestamp, so requests' TTFT, inter-token gaps and latencies
come out in virtual seconds. The host KV tier (kv_offloading_size) is the engine's own, its
copies timed on the same clock (tuner/sim/tiers.py).

Token ids are folded into a small vocabulary (id mod SIM_VOCAB): the logits stay small,
and equal prompts stay equal, so the prefix cache hits exactly as it would.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampler import Sampler, SampleResult
from engine.scheduler import ScheduledBatch
from engine.step_shape import FIGURES as STEP_FIGURES
from engine.step_shape import StepShape
from tuner.sim.profile import Profile

SIM_VOCAB = 1024


class VirtualClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ProfiledRunner:
    def __init__(self, profile: Profile, clock: VirtualClock, hf_config, *, num_blocks: int,
                 block_size: int, acceptance: float | tuple[float, ...] = 0.0,
                 seed: int = 0) -> None:
        self.profile, self.clock = profile, clock
        self.hf_config = hf_config
        self.vocab_size = min(SIM_VOCAB, profile.memory.vocab_size)
        self.model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.backend = SimpleNamespace(name="profile")
        self.kv_bytes_per_block = profile.memory.kv_bytes_per_token * block_size
        self.acceptance = acceptance
        self.rng = random.Random(seed)
        self._num_blocks = num_blocks
        self.steps = 0
        # what the real engine's step counters hold (paged:engine_step_duration_seconds,
        # paged:engine_step_shape): summed step seconds and summed shape figures
        self.totals = dict.fromkeys(("seconds",) + STEP_FIGURES, 0.0)

    def determine_num_blocks(self, max_model_len: int) -> int:
        return self._num_blocks

    def allocate_kv_cache(self, num_blocks: int) -> None:
        pass

    @staticmethod
    def is_device_fault(exc: BaseException) -> bool:
        return False

    def offload_io(self):
        """The host tier's copies in virtual time (tuner/sim/tiers.py)."""
        from tuner.sim.tiers import virtual_io

        memory = self.profile.memory
        return virtual_io(self.clock, self.kv_bytes_per_block,
                          store_seconds_per_byte=memory.store_seconds_per_byte,
                          load_seconds_per_byte=memory.load_seconds_per_byte,
                          disk_load_seconds_per_byte=memory.disk_load_seconds_per_byte)

    def _token(self, avoid: int | None = None) -> int:
        while True:
            token = self.rng.randrange(3, self.vocab_size)
            if token != avoid:
                return token

    def execute(self, batch: ScheduledBatch, prompt_logits: dict | None = None
                ) -> tuple[torch.Tensor, list[int]]:
        """The model runner's contract (rows: one per sampled sequence, 1 + d for a row
        with d drafts), at the profile's step time."""
        shape = StepShape.of(batch)
        seconds = self.profile.step_seconds(shape)
        self.clock.now += seconds
        self.steps += 1
        self.totals["seconds"] += seconds
        for name in STEP_FIGURES:
            self.totals[name] += getattr(shape, name)
        drafts = batch.draft_token_ids or [[]] * len(batch.seqs)
        rows, targets = [], []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            d = drafts[i]
            c = seq.num_computed_tokens
            if c + n - len(d) != seq.num_tokens:
                continue  # a prefill chunk that does not reach the prompt's end
            accepting = True
            for j, draft in enumerate(d):
                p = self.acceptance[j] if isinstance(self.acceptance, tuple) else self.acceptance
                accepting = accepting and self.rng.random() < p
                rows.append(i)
                targets.append(draft if accepting else self._token(avoid=draft))
            rows.append(i)
            targets.append(self._token())
            if prompt_logits is not None and seq.wants_prompt_logits:
                m = min(n, seq.num_prompt_tokens - 1 - c)
                if m > 0:
                    prompt_logits[i] = torch.zeros(m, self.vocab_size)
        return RowTokens(targets, self.vocab_size), rows


class RowTokens:
    """The profiled runner's logits: each row's token, the one its logits would make the
    sampler pick (`tensor()`: those logits, a spike of SPIKE at it). ProfiledSampler reads
    the tokens; anything else can ask for the tensor. Selecting rows (`[rows]`) and
    `shape` work as on the tensor, which is all the engine does with logits between the
    runner and the sampler (engine/batch_execution.py, engine/spec_decode/verifier.py)."""

    __slots__ = ("tokens", "vocab")
    SPIKE = 30.0

    def __init__(self, tokens: list[int], vocab: int) -> None:
        self.tokens, self.vocab = tokens, vocab

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.tokens), self.vocab)

    def __getitem__(self, rows) -> "RowTokens":
        return RowTokens([self.tokens[r] for r in rows], self.vocab)

    def tensor(self) -> torch.Tensor:
        logits = torch.zeros(len(self.tokens), self.vocab)
        if self.tokens:
            logits[torch.arange(len(self.tokens)), torch.tensor(self.tokens)] = self.SPIKE
        return logits


def _plain(params) -> bool:
    """A row the sampler's own arithmetic would give its logits' argmax, at a log
    probability of 0 to within e^-SPIKE x vocab, with nothing else to report."""
    return (params.temperature == 0 and params.logprobs is None and not params.logit_bias
            and not params.needs_penalties and params.structured_outputs is None
            and not params.min_tokens)


class ProfiledSampler(Sampler):
    """The engine's sampler, reading RowTokens: plain rows (`_plain`: greedy, no
    processors, no logprobs; every simulated request's) get their row's token without
    the [rows, vocab] arithmetic; any other batch goes through the sampler on the tensor."""

    def __call__(self, logits, seqs) -> SampleResult:
        if not isinstance(logits, RowTokens):
            return super().__call__(logits, seqs)
        if not all(_plain(s.params) for s in seqs):
            return super().__call__(logits.tensor(), seqs)
        n = len(seqs)
        return SampleResult(list(logits.tokens), [0.0] * n, [None] * n)


class TokenCountTokenizer:
    """What the engine's output processing asks of a tokenizer, for tokens that mean
    nothing: a token's text is one short word (the real tokenizer renders the prompts,
    tuner/sim/stream.py; decoding the simulator's made-up replies would only cost time)."""

    eos_token_id = None

    @staticmethod
    def decode(ids, **_) -> str:
        return " w" * len(ids)


def engine_config(settings: dict) -> EngineConfig:
    """The EngineConfig of these settings (api/paged_api/settings.py names; search
    dimensions such as num_speculative_tokens go into their object setting)."""
    from paged_api.search_space import SETTINGS as SEARCHABLE
    from paged_api.search_space import engine_values

    known = {k: v for k, v in settings.items() if k in SEARCHABLE}
    return EngineConfig(**{k: v for k, v in settings.items() if k not in known},
                        **{k: v for k, v in engine_values(known).items() if v is not None})


def sim_engine(profile: Profile, settings: dict, *, hf_config,
               acceptance: float = 0.0, drafts=None, seed: int = 0
               ) -> tuple[LLMEngine, VirtualClock]:
    """An LLMEngine with these settings (api/paged_api/settings.py names) on a profiled runner;
    its KV pool as large as the engine would make it (Profile.memory), unless
    num_gpu_blocks_override says. Search dimensions (num_speculative_tokens) go into
    their object setting as for a real trial. `drafts(speculative_config)`: the method's
    DraftModel, which then replaces the engine's proposer and `acceptance` (None: the
    engine's own proposer over the made-up tokens, accepted at `acceptance`). ValueError
    for settings the engine would refuse."""
    config = engine_config(settings)
    num_blocks = config.num_gpu_blocks_override or profile.memory.num_blocks(
        block_size=config.block_size, fraction=config.gpu_memory_utilization,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs, cpu_memory_gib=config.cpu_memory_gib)
    if num_blocks < 1:
        raise ValueError(f"no memory left for the KV cache at gpu_memory_utilization="
                         f"{config.gpu_memory_utilization}; raise it or lower "
                         "max_num_batched_tokens")
    clock = VirtualClock()
    runner = ProfiledRunner(profile, clock, hf_config, num_blocks=num_blocks,
                            block_size=config.block_size, acceptance=acceptance, seed=seed)
    engine = LLMEngine(config, runner=runner, tokenizer=TokenCountTokenizer(), clock=clock)
    sampler = ProfiledSampler(eos_token_ids=engine.info.eos_token_ids, seed=config.seed,
                              device=runner.device)
    sampler.structured = engine.sampler.structured
    engine.sampler = engine.output.sampler = sampler
    spec = config.speculative_config
    model = drafts(spec) if spec and drafts is not None else None
    if model is not None:
        from tuner.sim.drafts import ModelledProposer

        engine.scheduler.proposer = ModelledProposer(model, spec, vocab=runner.vocab_size,
                                                     seed=seed + 1)
        runner.acceptance = model.accept
    return engine, clock
