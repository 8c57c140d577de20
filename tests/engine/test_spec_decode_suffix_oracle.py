"""Suffix decoding against its definition, by brute force over random texts on a small
alphabet (engine/spec_decode/suffix_tree.py, suffix_proposer.py): the tree's counts, its
longest match, its continuation with its score and the node count it reports; the request's own draft;
the choice among match lengths and between the two sources; and the cache's limits. The
definitions below read only the (text, start) paths, never the tree."""
from __future__ import annotations

import collections
import itertools
import operator
import random

import pytest

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.spec_decode.gate import DraftGate
from engine.spec_decode.suffix_proposer import SuffixProposer, best_draft, own_draft
from engine.spec_decode.suffix_tree import SuffixCache, SuffixTree

MIN_PROBS = (0.0, 0.25, 1 / 3, 0.5, 2 / 3, 1.0)   # hit exactly by counts of 1..4


def paths(texts: list[list[int]], depth: int) -> collections.Counter:
    """count(w) for every w that starts some path text[s : s + depth]."""
    out: collections.Counter = collections.Counter()
    for t in texts:
        for s in range(len(t)):
            for n in range(1, min(depth, len(t) - s) + 1):
                out[tuple(t[s:s + n])] += 1
    return out


def longest(counts, context: list[int], depth: int) -> int:
    return next((m for m in range(min(len(context), depth), 0, -1)
                 if tuple(context[len(context) - m:]) in counts), 0)


def continuation(counts, total: int, depth: int, pattern, limit: int, min_prob: float):
    """The most frequent next token (the smaller among equals) while the draft's
    probability, a product of count(w + t) / count(w), stays >= min_prob."""
    path = tuple(pattern)
    if path and path not in counts:
        return [], 0.0
    here = counts[path] if path else total
    out, prob, score = [], 1.0, 0.0
    while len(out) < limit and len(path) < depth:
        kids = {w[-1]: c for w, c in counts.items() if len(w) == len(path) + 1
                and w[:-1] == path}
        if not kids:
            break
        token = max(kids, key=lambda t: (kids[t], -t))
        prob *= kids[token] / here
        if prob < min_prob:
            break
        out.append(token)
        score += prob
        path, here = path + (token,), kids[token]
    return out, score


def path_evidence(counts, total: int, pattern, drafts: list[int]) -> list[tuple[float, int]]:
    """Per drafted token t after path w: (count(w + t) / count(w), count(w))."""
    path, out = tuple(pattern), []
    for t in drafts:
        here = counts[path] if path else total
        out.append((counts[path + (t,)] / here, here))
        path += (t,)
    return out


def best(drafts_by_m: dict[int, tuple[list[int], float]]):
    """The highest score; among equals the longer match."""
    return max(drafts_by_m.items(), key=lambda kv: (kv[1][1], kv[0]), default=(0, ([], 0.0)))[1]


def own(tokens: list[int], depth: int, limit: int, factor: float, min_prob: float):
    """The request's own tokens: occurrences of its last m tokens ending before its last
    token, followed into the text (at most depth - m tokens)."""
    total = len(tokens)
    if total < 2 or limit <= 0:
        return [], 0.0

    def ends(m):
        return [j for j in range(m - 1, total - 1)
                if tokens[j - m + 1:j + 1] == tokens[total - m:]]
    top = max((m for m in range(1, min(depth - 1, total - 1) + 1) if ends(m)), default=0)
    drafts = {}
    for m in range(1, top + 1):
        nxt, out, prob, score = [j + 1 for j in ends(m)], [], 1.0, 0.0
        for _ in range(min(min(limit, int(factor * m)), depth - m)):
            live = [p for p in nxt if p < total]
            if not live:
                break
            votes = collections.Counter(tokens[p] for p in live)
            token = max(votes, key=lambda t: (votes[t], -t))
            prob *= votes[token] / len(nxt)
            if prob < min_prob:
                break
            out.append(token)
            score += prob
            nxt = [p + 1 for p in live if tokens[p] == token]
        drafts[m] = (out, score)
    return best(drafts)


def nodes(tree: SuffixTree) -> int:
    stack, n = [tree.root], 0
    while stack:
        node = stack.pop()
        n += 1
        stack.extend((node.children or {}).values())
    return n


def random_text(rng: random.Random, letters: int = 3, most: int = 9) -> list[int]:
    return [rng.randrange(letters) for _ in range(rng.randint(1, most))]


def test_the_tree_answers_as_its_paths_do_under_adds_and_removes():
    rng = random.Random(7)
    for trial in range(120):
        depth = rng.randint(1, 5)
        tree, live = SuffixTree(depth), []
        for _ in range(8):
            if live and rng.random() < 0.35:
                text = live.pop(rng.randrange(len(live)))
                for s in range(len(text)):
                    tree.remove(text, s)
            else:
                live.append(random_text(rng))
                for s in range(len(live[-1])):
                    tree.add(live[-1], s)
            counts, total = paths(live, depth), sum(map(len, live))
            assert tree.counts() == dict(counts) and tree.root.count == total, (trial, live)
            assert tree.num_nodes == nodes(tree), (trial, live)
            for _ in range(6):
                context = random_text(rng, most=7)
                assert tree.longest_match(context) == longest(counts, context, depth)
                pattern = context[len(context) - rng.randint(0, min(len(context), depth)):]
                limit, min_prob = rng.randint(1, 6), rng.choice(MIN_PROBS)
                drafts, score, evidence = tree.continuation(pattern, limit, min_prob)
                want, want_score = continuation(counts, total, depth, pattern, limit, min_prob)
                assert drafts == want, (trial, live, pattern, limit, min_prob)
                assert score == pytest.approx(want_score)
                assert evidence == path_evidence(counts, total, pattern, drafts)
        for text in live:   # everything out again: back to a bare root
            for s in range(len(text)):
                tree.remove(text, s)
        assert tree.num_nodes == nodes(tree) == 1 and tree.root.count == 0


def test_a_path_ending_where_another_continues_halves_the_tails_probability():
    tree = SuffixTree(max_depth=4)
    tree.add([1, 2, 3], 0)        # one path 1 2 3: node 1 keeps 2 3 as a tail
    tree.add([9, 1], 1)           # a path that ends at 1: count(1) = 2, count(1 2) = 1
    assert tree.continuation([1], 4, 0.5) == ([2, 3], 1.0, [(0.5, 2), (1.0, 1)])  # 1/2 each
    assert tree.continuation([1], 4, 0.51) == ([], 0.0, [])
    assert tree.continuation([7], 4, 0.0) == ([], 0.0, [])              # no such path
    assert tree.longest_match([1, 2, 3, 4]) == 0 and tree.longest_match([5, 1, 2]) == 2


def test_the_requests_own_draft_follows_its_definition():
    rng = random.Random(11)
    for trial in range(400):
        tokens = random_text(rng, letters=rng.choice((2, 3)), most=14)
        depth, limit = rng.randint(2, 6), rng.randint(0, 6)
        factor, min_prob = rng.choice((0.5, 1.0, 2.0)), rng.choice(MIN_PROBS)
        drafts, score, evidence, match = own_draft(tokens, depth, limit, factor, min_prob)
        want, want_score = own(tokens, depth, limit, factor, min_prob)
        assert drafts == want, (trial, tokens, depth, limit, factor, min_prob)
        assert score == pytest.approx(want_score)
        assert len(evidence) == len(drafts) and (match > 0) == bool(drafts)
        # the draft's estimated probabilities are the running products of its ratios
        assert sum(itertools.accumulate((r for r, _ in evidence), operator.mul)) == \
            pytest.approx(score)


def test_best_draft_takes_the_highest_score_the_longer_match_among_equals_and_stops_early():
    calls = []

    def draft_for(scores):
        def draft(m, cap):
            calls.append((m, cap))
            return [m] * min(cap, 1), scores.get(m, 0.0), [(1.0, 1)] * min(cap, 1)
        return draft
    # scores by match length: 3 and 1 tie at 0.75, 2 is lower; 4 has none
    assert best_draft(4, 8, 1.0, draft_for({3: 0.75, 2: 0.5, 1: 0.75}))[:2] == ([3], 0.75)
    assert calls == [(4, 4), (3, 3), (2, 2), (1, 1)]   # every length, one apart
    calls.clear()
    # once the best score reaches what a shorter match could at most draft, stop
    assert best_draft(4, 8, 1.0, draft_for({4: 2.0})) == ([4], 2.0, [(1.0, 1)], 4)
    assert calls == [(4, 4), (3, 3)]
    calls.clear()
    assert best_draft(3, 2, 1.0, draft_for({3: 2.0}))[:2] == ([3], 2.0) and calls == [(3, 2)]


def test_propose_picks_the_better_source_and_the_own_tokens_on_a_tie():
    rng = random.Random(5)
    for trial in range(150):
        depth = rng.randint(2, 5)
        proposer = SuffixProposer(num_speculative_tokens=6, max_tree_depth=depth,
                                  max_spec_factor=rng.choice((1.0, 2.0)),
                                  min_token_prob=rng.choice(MIN_PROBS))
        texts = [random_text(rng) for _ in range(rng.randint(1, 4))]
        for text in texts:
            proposer.cache.add(None, text)
        proposer.cache.flush()
        counts, total = paths(texts, depth), sum(map(len, texts))
        tokens, limit = random_text(rng, most=8), rng.randint(1, 6)
        p = proposer
        mine = own(tokens, depth, limit, p.max_spec_factor, p.min_token_prob)
        context = tokens[max(0, len(tokens) - (depth - 1)):]
        shared = best({m: continuation(counts, total, depth, context[len(context) - m:],
                                       min(limit, int(p.max_spec_factor * m)), p.min_token_prob)
                       for m in range(1, longest(counts, context, depth) + 1)})
        want = shared[0] if shared[1] > mine[1] else mine[0]
        assert proposer.propose(tokens, None, limit) == want, (trial, texts, tokens, depth)


def test_depth_two_matches_the_last_token_and_a_one_token_request_drafts_from_the_tree():
    proposer = SuffixProposer(num_speculative_tokens=4, max_tree_depth=2)
    proposer.cache.add(None, [5, 6])
    proposer.cache.flush()
    assert proposer.propose([1, 5], None, 4) == [6]
    # one token has no own draft (score 0): the tree's, worth 1/2 after 5 of [5, 6], [5, 7]
    proposer.cache.add(None, [5, 7])
    proposer.cache.flush()
    assert proposer.propose([5], None, 4) == [6] and proposer.propose([5], None, 0) == []


def test_the_cache_keeps_nothing_at_zero_and_the_newest_at_one():
    off = SuffixCache(max_depth=4, max_cached_requests=0)
    off.add(None, [1, 2, 3])
    off.flush()
    assert not off.trees and not off.cached and off.backlog == 0
    one = SuffixCache(max_depth=4, max_cached_requests=1)
    one.add(None, [1, 2])
    one.add(None, [3, 4])
    one.flush()
    assert [t for _, t in one.cached] == [[3, 4]] and one.trees[None].counts() == {
        (3,): 1, (3, 4): 1, (4,): 1}
    one.add(None, [])                      # an empty output is not cached
    assert [t for _, t in one.cached] == [[3, 4]]


def test_work_does_its_budget_exactly_and_more_while_a_backlog_builds():
    cache = SuffixCache(max_depth=3, max_cached_requests=10)
    cache.add(None, list(range(10)))
    cache.work(1)
    assert cache.backlog == 9 and cache.trees[None].root.count == 1
    cache.work(0)
    assert cache.backlog == 9
    big = SuffixCache(max_depth=3, max_cached_requests=10)
    big.add(None, list(range(1600)))
    big.work()   # 32 + 1600 // 16
    assert big.backlog == 1600 - (SuffixCache.WORK_PER_CALL + 100)


def test_the_proposers_defaults_and_bounds_are_vllms():
    p = SuffixProposer(num_speculative_tokens=1)
    assert (p.max_tree_depth, p.cache.max_cached_requests, p.max_spec_factor,
            p.min_token_prob) == (24, 10_000, 1.0, 0.1)
    seq = Sequence(request_id="r", token_ids=[1, 2, 1], num_prompt_tokens=3,
                   params=SamplingParams(max_tokens=4))
    assert p.draft(seq, room=4, batch_size=1) == [2]       # the default gate lets it draft
    # the bounds themselves are allowed
    SuffixProposer(num_speculative_tokens=1, max_tree_depth=1, max_cached_requests=0,
                   max_spec_factor=0.0, min_token_prob=0.0)
    SuffixProposer(num_speculative_tokens=1, min_token_prob=1.0)
    for bad in ({"num_speculative_tokens": 0}, {"max_tree_depth": 0},
                {"max_cached_requests": -1}, {"max_spec_factor": -0.5},
                {"min_token_prob": -0.1}, {"min_token_prob": 1.5}):
        with pytest.raises(AssertionError):
            SuffixProposer(**{"num_speculative_tokens": 2, **bad})


def test_the_config_reaches_the_proposer_and_its_gate():
    config = {"num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 7,
              "suffix_decoding_max_cached_requests": 5, "suffix_decoding_max_spec_factor": 2.5,
              "suffix_decoding_min_token_prob": 0.3, "disable_by_batch_size": 2}
    p = SuffixProposer.from_config(config)
    assert (p.num_speculative_tokens, p.max_tree_depth, p.cache.max_cached_requests,
            p.max_spec_factor, p.min_token_prob) == (3, 7, 5, 2.5, 0.3)
    assert isinstance(p.gate, DraftGate) and p.gate.max_batch == 2
    seq = Sequence(request_id="r", token_ids=[1, 2, 1], num_prompt_tokens=3,
                   params=SamplingParams(max_tokens=4))
    assert p.draft(seq, room=4, batch_size=2) == []          # the batch reached the bound
    assert p.draft(seq, room=4, batch_size=1) == [2, 1]   # a match of 1, factor 2.5: 2
