"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the
sequence's longest matching suffix (vLLM's `method: ngram`). Torch-free: the scheduler calls it.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.spec_decode.gate import DraftGate


class NgramProposer:
    def __init__(self, *, num_speculative_tokens: int, prompt_lookup_min: int,
                 prompt_lookup_max: int, gate: DraftGate | None = None) -> None:
        assert 1 <= prompt_lookup_min <= prompt_lookup_max and num_speculative_tokens >= 1
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self.gate = gate if gate is not None else DraftGate()

    @property
    def num_speculative_tokens(self) -> int:
        return self.k

    @classmethod
    def from_config(cls, config: dict) -> "NgramProposer":
        """From EngineConfig.speculative_config (checked and completed by the settings table)."""
        return cls(num_speculative_tokens=config["num_speculative_tokens"],
                   prompt_lookup_min=config["prompt_lookup_min"],
                   prompt_lookup_max=config["prompt_lookup_max"],
                   gate=DraftGate.from_config(config))

    def draft(self, seq, room: int, batch_size: int) -> list[int]:
        """The scheduler's call: drafts for a running decode `seq` (at most `room`) in a step
        with `batch_size` running sequences, unless the gate holds the sequence back."""
        if not self.gate.allows(seq, batch_size):
            return []
        limit = self.gate.length(seq, batch_size, min(room, self.k))
        drafts = self.propose(seq.token_ids, limit)   # [] for a limit of 0
        self.gate.handed_out(seq, drafts)
        return drafts

    def finished(self, seq) -> None:
        """Nothing to keep: n-gram drafts come from the sequence's own tokens only."""

    def propose(self, token_ids: list[int], max_tokens: int | None = None) -> list[int]:
        """Up to min(k, max_tokens) drafts to follow `token_ids` (prompt + output), or [].

        The longest suffix of n tokens (max_n down to min_n) that also occurs earlier;
        among its occurrences the latest, whose continuation is the freshest evidence; the
        drafts are the k tokens after it.
        """
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        total = len(token_ids)
        if k <= 0 or total <= self.min_n:
            return []
        # one vectorised pass over the whole sequence per n tried
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            suffix = tokens[total - n:]
            # windows starting at 0 .. total-n-1: every occurrence but the suffix itself
            windows = sliding_window_view(tokens[:total - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                # Copy what followed, overlapping like LZ77: a continuation that runs into
                # the suffix goes on with the drafts themselves (a loop of period p < k still
                # gets k drafts).
                start = int(hits[-1]) + n
                drafts = token_ids[start:start + k]
                while len(drafts) < k:
                    drafts.append(drafts[len(drafts) - (total - start)])
                return drafts
        return []
