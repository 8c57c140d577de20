"""Suffix decoding's parts (engine/spec_decode/suffix_tree.py, suffix_proposer.py): the
tree's counts and FIFO eviction traced on a small alphabet (against brute force:
test_spec_decode_suffix_oracle.py),
tenants isolated by cache_salt, the draft's length and probability rules, the config."""
from __future__ import annotations

import random
import tracemalloc

import pytest

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.spec_decode.proposer import make_proposer
from engine.spec_decode.suffix_proposer import SuffixProposer, own_draft
from engine.spec_decode.suffix_tree import SuffixCache, SuffixTree
from test_spec_decode_suffix_oracle import nodes

A, B, C = 1, 2, 3


def _add(tree: SuffixTree, tokens: list[int]) -> None:
    for s in range(len(tokens)):
        tree.add(tokens, s)


def test_counts_traced_step_by_step_on_three_letters():
    tree = SuffixTree(max_depth=3)
    first = [A, B, A]
    _add(tree, first)  # paths: ABA, BA, A
    assert tree.counts() == {(A,): 2, (A, B): 1, (A, B, A): 1, (B,): 1, (B, A): 1}
    # ABA is one node (A, count 2) with a tail: nothing seen twice, nothing spelt out
    assert tree.num_nodes == 3  # root, A, B
    _add(tree, [A, B, C])  # paths: ABC, BC, C
    assert tree.counts() == {(A,): 3, (A, B): 2, (A, B, A): 1, (A, B, C): 1, (B,): 2,
                             (B, A): 1, (B, C): 1, (C,): 1}
    # after A: B (2 of 3); after A B: A or C (1 of 2 each), the smaller token; then depth 3
    drafts, score, _ = tree.continuation([A], limit=5, min_prob=0.0)
    assert drafts == [B, A] and score == pytest.approx(2 / 3 + 2 / 3 * 1 / 2)
    # the walks through A B and B spelt out the tails they met: A, AB, ABA, ABC, B, BA,
    # BC, C and the root
    assert tree.num_nodes == 9
    assert tree.longest_match([C, A, B]) == 2 and tree.longest_match([C, C]) == 1


def test_the_most_frequent_child_wins_and_ties_go_to_the_smaller_token():
    tree = SuffixTree(max_depth=4)
    for text in ([A, B, C], [A, B, A], [A, B, C]):
        _add(tree, text)
    drafts, score, _ = tree.continuation([A, B], limit=4, min_prob=0.0)
    assert drafts == [C] and score == pytest.approx(2 / 3)
    tie = SuffixTree(max_depth=4)
    for text in ([B, C], [B, A]):
        _add(tie, text)
    assert tie.continuation([B], limit=4, min_prob=0.0)[0] == [A]


def test_text_seen_once_costs_one_node_per_token_and_repeats_share_nodes():
    tree = SuffixTree(max_depth=24)
    text = list(range(100, 400))  # no token repeats
    _add(tree, text)
    assert tree.num_nodes == nodes(tree) == 1 + len(text)
    for _ in range(50):  # the same text again and again: no new node after the second
        _add(tree, list(text))
    assert tree.num_nodes == nodes(tree) <= 1 + len(text) * 24
    before = tree.num_nodes
    _add(tree, list(text))
    assert tree.num_nodes == before


def test_fifo_evicts_the_oldest_request_first_traced_step_by_step():
    cache = SuffixCache(max_depth=2, max_cached_requests=2)
    cache.add(None, [A, B])
    cache.add(None, [B, C])
    cache.flush()
    assert cache.trees[None].counts() == {(A,): 1, (A, B): 1, (B,): 2, (B, C): 1, (C,): 1}
    cache.add(None, [C, A])  # three requests: [A, B] (the oldest) goes
    cache.flush()
    assert [t for _, t in cache.cached] == [[B, C], [C, A]]
    assert cache.trees[None].counts() == {(B,): 1, (B, C): 1, (C,): 2, (C, A): 1, (A,): 1}
    cache.add(None, [A, A])  # then [B, C]
    cache.flush()
    assert cache.trees[None].counts() == {(C,): 1, (C, A): 1, (A,): 3, (A, A): 1}
    assert cache.num_cached_tokens == 4


def test_adding_is_spread_over_later_calls_and_the_backlog_drains():
    cache = SuffixCache(max_depth=4, max_cached_requests=10)
    text = list(range(1000))
    cache.add("t", text)
    assert cache.backlog == 1000 and "t" not in cache.trees  # add itself inserts nothing
    cache.work()
    done = 1000 - cache.backlog
    assert 0 < done <= SuffixCache.WORK_PER_CALL + 1000 // 16
    calls = 1
    while cache.backlog:
        cache.work()
        calls += 1
    assert calls <= 20 and cache.trees["t"].root.count == 1000


def test_a_salted_requests_draft_never_contains_another_salts_text():
    proposer = SuffixProposer(num_speculative_tokens=8, max_tree_depth=8, min_token_prob=0.0)
    secret = [50, 51, 52, 53, 54, 55, 56, 57]
    for _ in range(3):
        proposer.cache.add("tenant-a", [10, 11, 12] + secret)
    proposer.cache.add("tenant-b", [10, 11, 12, 20, 21, 22])
    proposer.cache.flush()
    prompt = [7, 10, 11, 12]
    assert proposer.propose(prompt, "tenant-a", 8) == secret[:3]  # a match of 3
    for salt in ("tenant-b", None, "tenant-c"):
        drafts = proposer.propose(prompt, salt, 8)
        assert not set(drafts) & set(secret), (salt, drafts)
    assert proposer.propose(prompt, "tenant-b", 8) == [20, 21, 22]


def test_finished_sequences_feed_their_salts_tree_with_their_output_only():
    proposer = make_proposer({"method": "suffix", "num_speculative_tokens": 4,
                              "suffix_decoding_max_tree_depth": 6,
                              "suffix_decoding_max_cached_requests": 100,
                              "suffix_decoding_max_spec_factor": 1.0,
                              "suffix_decoding_min_token_prob": 0.1})
    assert isinstance(proposer, SuffixProposer) and proposer.max_tree_depth == 6
    seq = Sequence(request_id="r", token_ids=[9, 9, 9, 1, 2, 3, 4, 5], num_prompt_tokens=3,
                   params=SamplingParams(max_tokens=10), cache_salt="s")
    proposer.finished(seq)
    proposer.cache.flush()
    assert proposer.cache.trees["s"].root.count == 5  # output tokens only
    assert (9,) not in proposer.cache.trees["s"].counts()
    nxt = Sequence(request_id="q", token_ids=[7, 1, 2, 3], num_prompt_tokens=3,
                   params=SamplingParams(max_tokens=10), cache_salt="s")
    assert proposer.draft(nxt, room=8, batch_size=1) == [4, 5]
    assert proposer.draft(nxt, room=1, batch_size=1) == [4]


def test_the_draft_grows_with_the_match_and_stops_below_min_token_prob():
    # a match of m tokens drafts at most floor(factor * m)
    for m, factor, expected in [(1, 1.0, 1), (3, 1.0, 3), (3, 2.0, 6), (2, 0.5, 1)]:
        proposer = SuffixProposer(num_speculative_tokens=16, max_spec_factor=factor)
        proposer.cache.add(None, list(range(1, 21)))
        proposer.cache.flush()
        drafts = proposer.propose([99] + list(range(1, 1 + m)), None, 16)
        assert drafts == list(range(1 + m, 1 + m + expected)), (m, factor, drafts)
    # two continuations of 1, 2: 3 (twice) and 8 (once): p(3) = 2/3, then 1 each
    proposer = SuffixProposer(num_speculative_tokens=8, min_token_prob=0.7)
    for text in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [1, 2, 8, 9, 9, 9]):
        proposer.cache.add(None, text)
    proposer.cache.flush()
    assert proposer.propose([0, 1, 2], None, 8) == []  # 2/3 < 0.7
    proposer.min_token_prob = 0.6
    assert proposer.propose([0, 1, 2], None, 8) == [3, 4]  # a match of 2: 2 drafts


def test_own_tokens_draft_the_most_frequent_continuation_of_the_longest_match():
    text = [5, 1, 2, 3, 6, 1, 2, 3, 6, 1, 2, 4, 1, 2]
    # the longest match, "1 2", continues with 3, 3, 4, then 6, 6: two drafts (m = 2)
    drafts, score, evidence, match = own_draft(text, 24, 8, 1.0, 0.1)
    assert drafts == [3, 6] and score == pytest.approx(2 / 3 + 2 / 3)
    assert evidence == [(2 / 3, 3), (1.0, 2)] and match == 2  # 3 of 3, 4; then 6 of 6, 6
    drafts = own_draft([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 24, 2, 1.0, 0.1).tokens
    assert drafts == [3, 4]
    assert own_draft([1, 2, 3], 24, 4, 1.0, 0.1).tokens == []


def test_bytes_per_cached_token_stay_bounded():
    """10,000 tokens of varied but repetitive text (a vocabulary of 50): the tree costs at
    most a few hundred bytes per cached token (measured, not estimated)."""
    rng = random.Random(1)
    phrases = [[rng.randrange(50) for _ in range(rng.randint(3, 12))] for _ in range(40)]
    cache = SuffixCache(max_depth=24, max_cached_requests=10_000)
    texts = [[t for _ in range(10) for t in rng.choice(phrases)] for _ in range(100)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for text in texts:
        cache.add(None, text)
    cache.flush()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    per_token = used / cache.num_cached_tokens
    print(f"{per_token:.0f} bytes per cached token, {cache.num_nodes} nodes")
    assert per_token < 24 * 72, per_token  # far under one bare node per depth level
    assert cache.num_nodes < 24 * cache.num_cached_tokens


@pytest.mark.parametrize("key, value, message", [
    ("suffix_decoding_max_tree_depth", 0,
     r"^speculative_config\.suffix_decoding_max_tree_depth must be a whole number in 1\.\."),
    ("suffix_decoding_min_token_prob", -0.1,
     r"^speculative_config\.suffix_decoding_min_token_prob must be a number in \[0, 1\]"),
    ("suffix_decoding_max_spec_factor", -1,
     r"^speculative_config\.suffix_decoding_max_spec_factor must be a number in \[0, 64\]"),
    ("suffix_decoding_max_cached_requests", -1,
     r"^speculative_config\.suffix_decoding_max_cached_requests must be a whole number"),
    ("suffix_decoding_max_depth", 3, r"^speculative_config has no key "
     r"'suffix_decoding_max_depth'; known: .*suffix_decoding_max_tree_depth"),
    ("prompt_lookup_min", 2,
     r"^speculative_config\.prompt_lookup_min applies to method ngram only, not suffix$"),
])
def test_bad_suffix_configs_are_refused_at_start_up_naming_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config={"method": "suffix", "num_speculative_tokens": 4,
                                         key: value})


def test_the_suffix_config_takes_vllms_defaults_and_ngram_refuses_its_keys():
    cfg = EngineConfig(speculative_config={"method": "suffix", "num_speculative_tokens": 6})
    assert cfg.speculative_config == {
        "method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_cached_requests": 10_000, "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.1}
    with pytest.raises(ValueError, match=r"^speculative_config\.suffix_decoding_max_tree_depth "
                                         r"applies to method suffix only, not ngram$"):
        EngineConfig(speculative_config={"num_speculative_tokens": 2,
                                         "suffix_decoding_max_tree_depth": 8})
