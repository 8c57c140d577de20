"""Verifying drafts against the target model, keeping its distribution exact.

For a row with drafts d_1..d_k the model has scored k + 1 positions: after the last token,
and after each draft. Position j's target distribution p_j is what the sampler would use
had d_1..d_j been generated (penalties, min_tokens, temperature, top-k/top-p/min-p, all on
that history). The sampler draws x_j from p_j at every position; drafts are accepted while
x_j == d_j, and the first x_j that differs (or x_k after all k) is the step's last token.

This is rejection sampling with a point-mass draft (n-gram drafts are deterministic): d_j
is accepted with probability p_j(d_j), and on rejection x_j comes from p_j restricted to
tokens other than d_j, renormalised, which is the residual distribution max(p - q, 0).
Greedy rows are the temperature-0 case: accept while the argmax is the draft.

The draws are the ones the sampler would make without speculation, in the same order, so
a seeded request's stream (sample i of seed s draws from its own generator) gives the same
tokens with or without speculation; a seeded generator is rewound to exactly the draws
of the tokens that came out.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from engine.sampler import Sampler
from engine.sequence import Sequence


@dataclass
class Verified:
    # (token, logprob, top logprobs) of each token the step produced: the accepted drafts,
    # then the one the target sampled (a correction or the bonus token)
    tokens: list[tuple[int, float, dict[int, float] | None]]
    num_accepted: int  # drafts accepted (len(tokens) - 1)


def _after(seq: Sequence, drafts: list[int]) -> Sequence:
    """seq as the sampler should see it once `drafts` are generated (a shallow copy)."""
    if not drafts:
        return seq
    view = copy.copy(seq)
    view.token_ids = seq.token_ids + drafts
    return view


def _seeded(seq: Sequence) -> bool:
    return seq.params.seed is not None and seq.params.temperature > 0


def verify(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence],
           drafts: list[list[int]]) -> list[Verified]:
    """logits: [sum(1 + len(d)), vocab], each sequence's 1 + len(d) rows in order."""
    views = [_after(seq, d[:j]) for seq, d in zip(seqs, drafts) for j in range(len(d) + 1)]
    seeded = [s for s in seqs if _seeded(s)]
    before = sampler.snapshot(seeded) if seeded else None
    drawn = sampler(logits, views)
    out: list[Verified] = []
    redo_rows: list[int] = []
    redo_states = {}
    row = 0
    for seq, d in zip(seqs, drafts):
        a = 0
        while a < len(d) and drawn.token_ids[row + a] == d[a]:
            a += 1
        out.append(Verified([(drawn.token_ids[r], drawn.logprobs[r], drawn.top_logprobs[r])
                             for r in range(row, row + a + 1)], a))
        if a < len(d) and before is not None and seq.seq_id in before[1]:
            redo_rows += range(row, row + a + 1)
            redo_states[seq.seq_id] = before[1][seq.seq_id]
        row += len(d) + 1
    if redo_rows:
        # The seeded streams drew for every position; take them back to before the step and
        # draw again for the positions that produced a token only (nothing else changes).
        num_generators, _ = sampler.snapshot([])
        sampler.restore((num_generators, redo_states))
        sampler(logits[redo_rows], [views[r] for r in redo_rows])
    return out
