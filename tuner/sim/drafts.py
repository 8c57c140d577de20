"""Speculative decoding in the simulator, per method: how often a method drafts, how long,
and how much of it the target accepts, measured on the model's own replies.

The simulator's model writes made-up tokens, so a real proposer run inside it drafts as it
would over noise (almost never, and nothing it drafts is right). Instead:

- `replay` runs the engine's own proposer (engine/spec_decode, built by make_proposer from
  the same speculative_config, its back-off gate left off) over real replies of the model to
  the workload's requests, one decode step at a time as the engine verifies them: the drafts
  of a step are accepted up to the first one that differs from the reply, then the reply's
  next token is the step's own. A reply sampled at the workload's temperature gives the
  acceptance of rejection sampling in expectation (a draft token x is accepted with
  probability p(x), the probability that the sampled token is x); a greedy reply gives it
  exactly. Suffix decoding learns each reply once it is finished, in the order given.
- The result is a `DraftModel`: the share of decode steps that drafted, the distribution of
  the draft lengths, and each position's acceptance given the ones before it were accepted.
- `ModelledProposer` is a Proposer (engine/spec_decode/proposer.py) for the simulated
  engine: it drafts as the model says, through the engine's own DraftGate (so the back-off
  keys, disable_by_batch_size, min_acceptance_rate and adaptive_draft_knee, act on the
  simulated batch as on a real one), and the profiled runner accepts each position at the
  model's rate (tuner/sim/engine.py).

What this leaves out: a position's acceptance is pooled over draft lengths and requests
(a long suffix draft and a short one share their per-position rates), and drafts do not
depend on the batch they run in.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.spec_decode.gate import DraftGate
from engine.spec_decode.proposer import make_proposer

# speculative_config keys that decide when a sequence drafts, not what: the simulated
# engine applies them live (DraftGate), so the replay leaves them out
GATE_KEYS = ("min_acceptance_rate", "acceptance_probe_interval", "disable_by_batch_size",
             "adaptive_draft_knee")


@dataclass(frozen=True)
class Reply:
    prompt_ids: list[int]
    output_ids: list[int]
    max_tokens: int
    cache_salt: str | None = None


@dataclass(frozen=True)
class DraftModel:
    """Counts of a replay: `steps` decode steps, `drafting` of them with drafts,
    `length_counts[i]` with i + 1 drafts; `offered[j]` drafts at position j + 1 verified
    after the j before them were accepted, `accepted[j]` of them accepted."""
    method: str
    steps: int
    drafting: int
    length_counts: tuple[int, ...]
    offered: tuple[int, ...]
    accepted: tuple[int, ...]

    @property
    def draft_share(self) -> float:
        return self.drafting / self.steps if self.steps else 0.0

    @property
    def lengths(self) -> tuple[float, ...]:
        """Share of the drafting steps with 1, 2, ... drafts."""
        return tuple(c / self.drafting if self.drafting else 0.0 for c in self.length_counts)

    @property
    def accept(self) -> tuple[float, ...]:
        """P(draft j + 1 accepted | drafts 1..j were), j = 0..k-1 (0 where never verified)."""
        return tuple(a / o if o else 0.0 for a, o in zip(self.accepted, self.offered))

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a decode step yields (1 + accepted drafts), ungated."""
        gained, accept = 0.0, self.accept
        for i, share in enumerate(self.lengths):
            p = 1.0
            for j in range(i + 1):
                p *= accept[j]
                gained += share * p
        return 1.0 + self.draft_share * gained


def drafting_key(spec: dict) -> tuple:
    """What decides a method's drafts (the config without its gate keys), hashable."""
    return tuple(sorted((k, v) for k, v in spec.items() if k not in GATE_KEYS))


def replay(spec: dict, replies: list[Reply]) -> DraftModel:
    """The DraftModel of `spec` (a checked speculative_config) over `replies`, in order.
    ValueError when no reply has a decode step (every reply one token or none)."""
    proposer = make_proposer({k: v for k, v in spec.items() if k not in GATE_KEYS})
    k = proposer.num_speculative_tokens
    steps = drafting = 0
    lengths, offered, accepted = [0] * k, [0] * k, [0] * k
    for n, reply in enumerate(replies):
        out = reply.output_ids
        seq = Sequence(request_id=f"replay-{n}", token_ids=list(reply.prompt_ids) + out[:1],
                       num_prompt_tokens=len(reply.prompt_ids),
                       params=SamplingParams(max_tokens=reply.max_tokens),
                       cache_salt=reply.cache_salt)
        t = 1
        while t < len(out):
            room = reply.max_tokens - t - 1   # the scheduler's room (engine/scheduler.py)
            drafts = proposer.draft(seq, room, 1) if room > 0 else []
            steps += 1
            a = 0
            while a < len(drafts) and t + a < len(out) and drafts[a] == out[t + a]:
                a += 1
            if drafts:
                drafting += 1
                lengths[len(drafts) - 1] += 1
                for j in range(min(a + 1, len(drafts))):  # verified up to the first miss
                    offered[j] += 1
                    accepted[j] += j < a
            seq.token_ids.extend(out[t:t + a + 1])
            t += a + 1
        proposer.finished(seq)
    if steps == 0:
        raise ValueError("no reply has a decode step to replay drafts on (every reply has "
                         "at most one token); raise the workload's max_tokens")
    return DraftModel(spec.get("method", "ngram"), steps, drafting, tuple(lengths),
                      tuple(offered), tuple(accepted))


def from_counters(method: str, k: int, *, steps: float, drafts: float, draft_tokens: float,
                  accepted_per_pos: list[float]) -> DraftModel:
    """A DraftModel from a running service's counters over a window: decode steps (rows of
    paged:engine_step_shape's decode_seqs), vllm:spec_decode_num_drafts and
    num_draft_tokens, and num_accepted_tokens_per_pos by position (0-based). The counters
    give the mean draft length only: the drafts are taken as of the two whole lengths
    around it; position j + 1 is offered to the drafts that accepted j and are longer than
    j, as many as the length shares say but never fewer than it accepted (exact when
    every draft has one length). The
    counters are the gated engine's: the share drafting counts the steps the back-off gate
    kept from drafting too, and the simulated gate acts again on top."""
    n = max(0, round(drafts))
    tokens = min(max(round(draft_tokens), n), n * k)
    lengths = [0] * k
    if n:
        short = tokens // n
        long = tokens - short * n   # drafts one token longer
        if short:
            lengths[short - 1] += n - long
        if long:
            lengths[short] += long
    at_least = [sum(lengths[j:]) for j in range(k)]   # drafts of length > j
    accepted, offered = [0] * k, [0] * k
    for j in range(k):
        got = round(accepted_per_pos[j]) if j < len(accepted_per_pos) else 0
        if j == 0:
            offered[0] = n
        elif at_least[j - 1]:   # never fewer than were accepted there
            offered[j] = min(accepted[j - 1], max(
                got, round(accepted[j - 1] * at_least[j] / at_least[j - 1])))
        accepted[j] = min(got, offered[j])
    return DraftModel(method, max(round(steps), n), n, tuple(lengths), tuple(offered),
                      tuple(accepted))


class ModelledProposer:
    """Drafts `model` says a method would make, of made-up tokens below `vocab`; the
    engine's DraftGate from `spec` decides whether and how long first."""

    def __init__(self, model: DraftModel, spec: dict, *, vocab: int, seed: int = 0) -> None:
        self.model = model
        self.num_speculative_tokens = spec["num_speculative_tokens"]
        self.gate = DraftGate.from_config(spec)
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.share, self.weights = model.draft_share, model.lengths
        self._sizes = range(1, len(self.weights) + 1)

    def draft(self, seq, room: int, batch_size: int) -> list[int]:
        if not self.gate.allows(seq, batch_size):
            return []
        limit = self.gate.length(seq, batch_size, min(room, self.num_speculative_tokens))
        drafts: list[int] = []
        if limit > 0 and self.rng.random() < self.share:
            size = self.rng.choices(self._sizes, weights=self.weights)[0]
            drafts = [self.rng.randrange(3, self.vocab) for _ in range(min(size, limit))]
        self.gate.handed_out(seq, drafts)
        return drafts

    def finished(self, seq) -> None:
        """Nothing to learn: the model was measured on real replies."""


def model_replies(model: str | None, requests: list, *, seed: int = 0,
                  ignore_eos: bool = True, **engine_kwargs) -> list[Reply]:
    """The model's own replies to `requests` (tuner/sim/stream.SimRequest: their prompt
    ids, max_tokens and temperature) from the real engine, sampled as a workload's requests
    are (their temperature, else the server's default sampling), seeded per request;
    `ignore_eos`: to max_tokens, as the simulated requests run."""
    from transformers.utils import logging as hf_logging

    from engine import LLM

    hf_logging.disable_progress_bar()   # no weight-loading bar in the sweep's log
    llm = LLM(model, **engine_kwargs)
    prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
    params = [SamplingParams(max_tokens=r.max_tokens, seed=seed * 1_000_003 + i,
                             ignore_eos=ignore_eos,
                             **({} if r.temperature is None
                                else {"temperature": r.temperature}))
              for i, r in enumerate(requests)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [Reply(list(r.prompt_ids), list(o.outputs[0].token_ids), r.max_tokens)
            for r, o in zip(requests, outputs)]
