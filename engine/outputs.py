"""What `generate` and `step` return, under vLLM's names."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: str | int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    priority: int = 0
    # SamplingParams.prompt_logprobs: one entry per prompt token (None for the first), each
    # {token id: logprob} holding the prompt's token and the top alternatives
    prompt_logprobs: list[dict[int, float] | None] | None = None
    extra: dict = field(default_factory=dict)
    # Set (a short message) when the engine failed this request: it comes out once, finished,
    # with its unfinished samples' finish_reason "error"; other requests carry on.
    error: str | None = None


@dataclass
class EngineStats:
    num_requests_running: int
    num_requests_waiting: int
    num_seqs_running: int
    num_seqs_waiting: int
    kv_cache_usage: float  # used blocks / all blocks
    num_blocks: int
    block_size: int
    num_free_blocks: int
    num_cached_blocks: int
    num_used_blocks: int
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    num_preemptions: int
    cow_copies: int
    evictions: int
    prompt_tokens: int
    generation_tokens: int
    # speculative decoding (vLLM's spec_decode counters): rows that carried drafts, drafts
    # verified, drafts accepted, and accepted at each draft position (0 = first draft)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: tuple[int, ...] = ()
