"""Suffix decoding (vLLM's `method: suffix`, after Arctic Inference's SuffixDecoding): drafts
from what the service has already written (torch-free; the scheduler calls it).

Two sources, the draft with the higher score wins:
- the global trees (engine/spec_decode/suffix_tree.py): the outputs of finished requests of
  the same `cache_salt` only (tenants share nothing, as with the prefix cache), the oldest
  forgotten beyond suffix_decoding_max_cached_requests;
- the request's own tokens (prompt + output so far), read as a suffix tree of the same depth
  whose counts are computed from the occurrences directly (numpy, nothing kept between
  steps). The occurrence being matched, the request's last tokens themselves, is left out:
  it has no continuation yet.

In either, the request's last m tokens are matched (m <= suffix_decoding_max_tree_depth),
and the draft follows the most frequent continuation, token by token, while the estimated
probability of the whole draft (the product of count(child) / count(node)) stays at or above
suffix_decoding_min_token_prob. A longer match earns a longer draft: at most
floor(suffix_decoding_max_spec_factor * m) tokens, and never more than num_speculative_tokens
(a maximum, not a fixed length). Every match length from the longest down is tried while it
could still beat the best score so far (a draft's score, the sum of its tokens'
probabilities, is at most its length).

With adaptive_draft_knee the draft is then cut by the gate (DraftGate.cut): each token's
probability is calibrated on what the verifier did with earlier drafts of the same kind
(source, match length, its count evidence, position; engine/spec_decode/calibration.py), and
the draft keeps the tokens that pay for their verification at the step's batch size.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from engine.sequence import Sequence
from engine.spec_decode.calibration import draft_keys
from engine.spec_decode.gate import DraftGate
from engine.spec_decode.suffix_tree import SuffixCache

# draft_for(m, cap): (tokens, score, evidence per token: (count ratio, count of the node))
Continuation = tuple[list[int], float, list[tuple[float, int]]]


class Draft(NamedTuple):
    tokens: list[int]
    score: float  # the sum of the tokens' estimated probabilities
    evidence: list[tuple[float, int]]  # per token: (count(child) / count(node), count(node))
    match: int = 0  # how many of the request's last tokens it continues


NO_DRAFT = Draft([], 0.0, [], 0)


def best_draft(longest: int, limit: int, max_spec_factor: float,
               draft_for: Callable[[int, int], Continuation]) -> Draft:
    """The best-scoring draft over match lengths longest..1; draft_for(m, cap) drafts at
    most cap tokens after a match of m."""
    best = NO_DRAFT
    for m in range(longest, 0, -1):
        cap = min(limit, int(max_spec_factor * m))
        if cap <= best.score:
            break
        drafts, score, evidence = draft_for(m, cap)
        if score > best.score:
            best = Draft(drafts, score, evidence, m)
    return best


def own_draft(token_ids: list[int], max_depth: int, limit: int, max_spec_factor: float,
              min_prob: float) -> Draft:
    """The draft from the request's own tokens (the per-request tree)."""
    total = len(token_ids)
    if total < 2 or limit <= 0:
        return NO_DRAFT
    tokens = np.asarray(token_ids, dtype=np.int64)
    n = total - 1  # occurrences end at 0 .. total - 2 (not the last tokens themselves)
    # match[j]: how many of the last tokens also end at position j (at most max_depth - 1:
    # a match of the whole depth would leave no room to continue)
    match = np.zeros(n, dtype=np.int32)
    alive = np.ones(n, dtype=bool)
    for d in range(min(max_depth - 1, n)):
        same = np.zeros(n, dtype=bool)
        same[d:] = tokens[:n - d] == tokens[total - 1 - d]
        alive &= same
        if not alive.any():
            break
        match += alive
    longest = int(match.max())

    def draft_for(m: int, cap: int) -> Continuation:
        nxt = np.flatnonzero(match >= m) + 1  # where each occurrence continues
        out: list[int] = []
        evidence: list[tuple[float, int]] = []
        prob, score = 1.0, 0.0
        for _ in range(min(cap, max_depth - m)):
            live = nxt[nxt < total]
            if live.size == 0:
                break
            values, counts = np.unique(tokens[live], return_counts=True)
            top = int(np.argmax(counts))  # among equals the smallest token, as the tree
            ratio = counts[top] / nxt.size  # nxt.size: every occurrence reaching the node
            prob *= ratio
            if prob < min_prob:
                break
            out.append(int(values[top]))
            evidence.append((float(ratio), int(nxt.size)))
            score += prob
            nxt = live[tokens[live] == values[top]] + 1
        return out, score, evidence

    return best_draft(longest, limit, max_spec_factor, draft_for)


class SuffixProposer:
    def __init__(self, *, num_speculative_tokens: int, max_tree_depth: int = 24,
                 max_cached_requests: int = 10_000, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, gate: DraftGate | None = None) -> None:
        assert num_speculative_tokens >= 1 and max_tree_depth >= 1
        assert max_cached_requests >= 0 and max_spec_factor >= 0 and 0 <= min_token_prob <= 1
        self.num_speculative_tokens = num_speculative_tokens
        self.max_tree_depth = max_tree_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.cache = SuffixCache(max_tree_depth, max_cached_requests)
        self.gate = gate if gate is not None else DraftGate()

    @classmethod
    def from_config(cls, config: dict) -> "SuffixProposer":
        """From EngineConfig.speculative_config (checked and completed by the settings table)."""
        return cls(num_speculative_tokens=config["num_speculative_tokens"],
                   max_tree_depth=config["suffix_decoding_max_tree_depth"],
                   max_cached_requests=config["suffix_decoding_max_cached_requests"],
                   max_spec_factor=config["suffix_decoding_max_spec_factor"],
                   min_token_prob=config["suffix_decoding_min_token_prob"],
                   gate=DraftGate.from_config(config))

    def draft(self, seq: Sequence, room: int, batch_size: int) -> list[int]:
        self.cache.work()  # a bounded share of the queued outputs goes into the trees
        if not self.gate.allows(seq, batch_size):
            return []
        limit = min(room, self.num_speculative_tokens)
        if self.gate.calibration is None:
            drafts = self.propose(seq.token_ids, seq.cache_salt, limit)
            self.gate.handed_out(seq, drafts)
            return drafts
        # adaptive_draft_knee: the draft is cut where its calibrated probabilities stop
        # paying for the tokens verified (engine/spec_decode/calibration.py)
        draft, shared = self.propose_draft(seq.token_ids, seq.cache_salt, limit)
        keys = draft_keys(draft.evidence, draft.match, shared)
        k = self.gate.cut(seq, batch_size, keys)
        self.gate.handed_out(seq, draft.tokens[:k], keys)
        return draft.tokens[:k]

    def propose(self, token_ids: list[int], cache_salt: str | None, limit: int) -> list[int]:
        """Up to `limit` drafts to follow `token_ids`, from the salt's tree or the tokens."""
        return self.propose_draft(token_ids, cache_salt, limit)[0].tokens

    def propose_draft(self, token_ids: list[int], cache_salt: str | None, limit: int
                      ) -> tuple[Draft, bool]:
        """The best draft of at most `limit` tokens, and whether it came from the salt's
        tree (True) or the request's own tokens (False)."""
        if limit <= 0:
            return NO_DRAFT, False
        depth, factor, min_prob = self.max_tree_depth, self.max_spec_factor, self.min_token_prob
        own = own_draft(token_ids, depth, limit, factor, min_prob)
        tree = self.cache.trees.get(cache_salt)
        if tree is None:
            return own, False
        context = token_ids[-(depth - 1):] if depth > 1 else []
        longest = tree.longest_match(context)
        shared = best_draft(longest, limit, factor, lambda m, cap: tree.continuation(
            context[len(context) - m:], cap, min_prob))
        return (shared, True) if shared.score > own.score else (own, False)

    def finished(self, seq: Sequence) -> None:
        """Queue the output for the salt's tree (inserted by later draft calls)."""
        self.cache.add(seq.cache_salt, seq.output_token_ids)
