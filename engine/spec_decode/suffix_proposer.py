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
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.sequence import Sequence
from engine.spec_decode.gate import DraftGate
from engine.spec_decode.suffix_tree import SuffixCache

Draft = tuple[list[int], float]  # tokens and score


def best_draft(longest: int, limit: int, max_spec_factor: float,
               draft_for: Callable[[int, int], Draft]) -> Draft:
    """The best-scoring draft over match lengths longest..1; draft_for(m, cap) drafts at
    most cap tokens after a match of m."""
    best: Draft = ([], 0.0)
    for m in range(longest, 0, -1):
        cap = min(limit, int(max_spec_factor * m))
        if cap <= best[1]:
            break
        drafts, score = draft_for(m, cap)
        if score > best[1]:
            best = (drafts, score)
    return best


def own_draft(token_ids: list[int], max_depth: int, limit: int, max_spec_factor: float,
              min_prob: float) -> Draft:
    """The draft from the request's own tokens (the per-request tree)."""
    total = len(token_ids)
    if total < 2 or limit <= 0:
        return [], 0.0
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

    def draft_for(m: int, cap: int) -> Draft:
        nxt = np.flatnonzero(match >= m) + 1  # where each occurrence continues
        out: list[int] = []
        prob, score = 1.0, 0.0
        for _ in range(min(cap, max_depth - m)):
            live = nxt[nxt < total]
            if live.size == 0:
                break
            values, counts = np.unique(tokens[live], return_counts=True)
            top = int(np.argmax(counts))  # among equals the smallest token, as the tree
            prob *= counts[top] / nxt.size  # nxt.size: every occurrence reaching the node
            if prob < min_prob:
                break
            out.append(int(values[top]))
            score += prob
            nxt = live[tokens[live] == values[top]] + 1
        return out, score

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
        limit = self.gate.length(seq, batch_size, min(room, self.num_speculative_tokens))
        drafts = self.propose(seq.token_ids, seq.cache_salt, limit)
        self.gate.handed_out(seq, drafts)
        return drafts

    def propose(self, token_ids: list[int], cache_salt: str | None, limit: int) -> list[int]:
        """Up to `limit` drafts to follow `token_ids`, from the salt's tree or the tokens."""
        if limit <= 0:
            return []
        depth, factor, min_prob = self.max_tree_depth, self.max_spec_factor, self.min_token_prob
        own = own_draft(token_ids, depth, limit, factor, min_prob)
        tree = self.cache.trees.get(cache_salt)
        if tree is None:
            return own[0]
        context = token_ids[-(depth - 1):] if depth > 1 else []
        longest = tree.longest_match(context)
        shared = best_draft(longest, limit, factor, lambda m, cap: tree.continuation(
            context[len(context) - m:], cap, min_prob))
        return shared[0] if shared[1] > own[1] else own[0]

    def finished(self, seq: Sequence) -> None:
        """Queue the output for the salt's tree (inserted by later draft calls)."""
        self.cache.add(seq.cache_salt, seq.output_token_ids)
