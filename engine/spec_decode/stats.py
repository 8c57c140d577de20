"""Counters of speculative decoding, under vLLM's spec_decode names (metrics read them)."""
from __future__ import annotations


class SpecDecodeStats:
    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_drafts = 0  # rows that carried drafts
        self.num_draft_tokens = 0  # drafts verified
        self.num_accepted_tokens = 0  # drafts accepted
        self.accepted_per_pos = [0] * num_speculative_tokens  # accepted at position j

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_per_pos[j] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
