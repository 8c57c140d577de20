"""Sequence state shared by the scheduler and the KV cache manager (no torch here)."""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One token stream: a prompt plus one sample's generated tokens.

    `num_computed_tokens` counts the tokens whose K/V sit in the cache; the tokens after
    it are what the next step must compute (a prefill chunk, or the one token to decode).
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    index: int = 0  # which of the request's n samples
    priority: int = 0
    arrival_order: int = 0
    cache_salt: str | None = None
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # full blocks of token_ids
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at the first admission
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    has_forked: bool = False
    # While the prompt's logprobs are still to be computed: the runner returns the logits of
    # every prompt position, and the prefix cache is not read for it (cached positions would
    # have none).
    wants_prompt_logits: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def sort_key(self, policy: str) -> tuple[int, int, int]:
        """Smaller runs first: (priority, arrival, sample index); FCFS ignores priority."""
        prio = self.priority if policy == "priority" else 0
        return (prio, self.arrival_order, self.index)

    def fork(self, index: int) -> "Sequence":
        """A sibling sample sharing everything computed so far (blocks are shared by the caller)."""
        return Sequence(
            request_id=self.request_id, token_ids=list(self.token_ids),
            num_prompt_tokens=self.num_prompt_tokens, params=self.params, index=index,
            priority=self.priority, arrival_order=self.arrival_order, cache_salt=self.cache_salt,
            status=self.status, block_table=list(self.block_table),
            block_hashes=list(self.block_hashes), num_computed_tokens=self.num_computed_tokens,
            num_cached_tokens=self.num_cached_tokens, has_forked=True,
            logprobs=[] if self.logprobs is not None else None)
