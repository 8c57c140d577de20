"""Speculative decoding's torch-free half: the n-gram proposer, the scheduler's draft budget
and KV slots, the roll-back of rejected drafts' blocks, and the config's checks."""
from __future__ import annotations

import json

import pytest

from paged_api import settings
from engine.config import EngineConfig
from engine.kv_cache_manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.spec_decode.ngram_proposer import NgramProposer


def _proposer(k=3, lo=1, hi=3):
    return NgramProposer(num_speculative_tokens=k, prompt_lookup_min=lo, prompt_lookup_max=hi)


def _reference_propose(tokens, k, lo, hi):
    """The definition, by brute force: longest suffix n in hi..lo that occurs earlier; its
    latest earlier start; the k tokens after it, continuing into the drafts themselves."""
    for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
        suffix = tokens[-n:]
        starts = [s for s in range(len(tokens) - n) if tokens[s:s + n] == suffix]
        if starts:
            out = list(tokens)
            for i in range(k):
                out.append(out[starts[-1] + n + i])
            return out[len(tokens):]
    return []


@pytest.mark.parametrize("tokens, expected", [
    ([1, 2, 3, 4, 5, 1, 2, 3], [4, 5, 1]),      # the 3-gram [1 2 3] recurs
    ([1, 2, 3, 4, 1, 2, 9, 1, 2], [9, 1, 2]),   # [1 2] twice before: the latest wins
    ([7, 8, 9, 1, 8, 9], [1, 8, 9]),            # the longest match ([8 9]), not [9] alone
    ([5, 5, 5, 5], [5, 5, 5]),                  # a loop shorter than k continues itself
    ([1, 2, 3], []),                            # nothing recurs
    ([4], []),
])
def test_proposals_are_the_continuation_of_the_longest_latest_match(tokens, expected):
    assert _proposer().propose(tokens) == expected


def test_proposer_matches_the_brute_force_definition():
    import random

    rng = random.Random(0)
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        k, lo = rng.randrange(1, 6), rng.randrange(1, 4)
        hi = lo + rng.randrange(0, 4)
        got = _proposer(k, lo, hi).propose(tokens)
        assert got == _reference_propose(tokens, k, lo, hi), (tokens, k, lo, hi)


def test_prompt_lookup_min_and_max_bound_the_match():
    tokens = [1, 2, 9, 3, 1, 2]  # only a 2-gram ([1 2]) recurs
    assert _proposer(lo=3, hi=4).propose(tokens) == []
    assert _proposer(lo=1, hi=1).propose(tokens) == [9, 3, 1]  # [2] alone: the same place
    assert _proposer(k=2).propose(tokens, max_tokens=1) == [9]
    assert _proposer().propose(tokens, max_tokens=0) == []


# ---- the scheduler -----------------------------------------------------------------------

def _decoding_seq(rid, tokens, *, max_tokens=64, prompt_len=None):
    """A running-ready sequence with one output token (so it is a decode)."""
    n = prompt_len if prompt_len is not None else len(tokens) - 1
    return Sequence(request_id=rid, token_ids=list(tokens), num_prompt_tokens=n,
                    params=SamplingParams(max_tokens=max_tokens))


def _run_to_decode(sched: Scheduler, seqs):
    """Admit seqs and compute all but their last token (as after a prefill that sampled it)."""
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        assert n == s.num_tokens and batch.draft_token_ids[batch.seqs.index(s)] == []
        sched.advance(s, n - 1)
        sched.kv.trim(s)
    assert all(s.num_tokens - s.num_computed_tokens == 1 for s in seqs)


def test_drafts_count_against_the_token_budget_and_leave_one_token_to_each_decode():
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=True)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64,
                      proposer=_proposer(k=4), max_model_len=256)
    loops = [_decoding_seq(r, [1, 2, 3] * 4) for r in "AB"]
    _run_to_decode(sched, loops)
    batch = sched.schedule()
    assert batch.draft_token_ids == [[1, 2, 3, 1], [1, 2, 3, 1]]
    assert batch.num_new_tokens == [5, 5]
    for s in loops:  # KV slots for the last token and its drafts
        assert len(s.block_table) == kv.blocks_for(s.num_computed_tokens + 5)

    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=True)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64,
                      proposer=_proposer(k=4), max_model_len=256)
    loops = [_decoding_seq(r, [1, 2, 3] * 4) for r in "ABC"]
    _run_to_decode(sched, loops)
    sched.max_num_batched_tokens = 6  # 3 decodes + 3 tokens to spare
    batch = sched.schedule()
    assert batch.num_new_tokens == [4, 1, 1], "A's drafts must leave B and C their token"
    assert batch.draft_token_ids == [[1, 2, 3], [], []]


def test_drafts_stop_before_max_tokens_and_max_model_len():
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64,
                      proposer=_proposer(k=4), max_model_len=14)
    # A: 1 output token of max 3 -> one more sampled after at most 1 draft
    a = _decoding_seq("A", [1, 2, 3] * 3, max_tokens=3)
    # B: 12 of max_model_len 14 tokens -> 1 draft + the sampled token fill it
    b = _decoding_seq("B", [1, 2, 3] * 4)
    _run_to_decode(sched, [a, b])
    batch = sched.schedule()
    assert batch.draft_token_ids == [[1], [1]]


def test_speculation_gives_way_to_blocks_rather_than_preempting():
    kv = KVCacheManager(num_blocks=3, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64,
                      proposer=_proposer(k=4), max_model_len=64)
    a = _decoding_seq("A", [1, 2, 1, 2, 1])  # 4 computed tokens: one full block
    b = _decoding_seq("B", [5, 6, 7, 5])
    _run_to_decode(sched, [a, b])
    assert kv.num_available == 1
    batch = sched.schedule()
    # with 4 drafts A needs 2 more blocks (9 slots); there is 1: no drafts, nobody preempted
    assert batch.preempted == [] and batch.draft_token_ids == [[], []]
    assert batch.num_new_tokens == [1, 1]
    # with room for them the drafts come back
    sched.finish(b, "stop")
    sched.advance(a, 1)
    a.token_ids.append(2)
    assert sched.schedule().draft_token_ids == [[1, 2, 1, 2]]


def test_trim_frees_only_the_blocks_of_rejected_drafts_and_caches_none_of_them():
    kv = KVCacheManager(num_blocks=16, block_size=2, enable_prefix_caching=True)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64,
                      proposer=_proposer(k=4), max_model_len=64)
    a = _decoding_seq("A", [1, 2, 3, 1, 2])
    _run_to_decode(sched, [a])
    free_before = kv.num_available
    batch = sched.schedule()
    assert batch.draft_token_ids == [[3, 1, 2, 3]]
    assert len(a.block_table) == 5  # 9 slots after the 4 computed tokens
    # verification accepted 1 draft ([3]) and sampled 7 instead of the next: the last token
    # and one draft are computed; their 6 tokens fill 3 blocks, 2 blocks held only drafts
    a.token_ids.append(3)
    sched.advance(a, 2)
    a.token_ids.append(7)
    sched.rollback(a)
    assert len(a.block_table) == 3 and a.num_computed_tokens == 6
    assert kv.num_available == free_before - 1  # 2 blocks before this step, 3 now
    kv.check_invariants([a])
    cached = [b for b in kv.blocks if b.block_hash is not None]
    assert sorted(b.block_id for b in cached) == sorted(a.block_table)  # full, computed ones
    sched.finish(a, "stop")
    kv.check_invariants([])
    assert kv.stats().num_used == 0


# ---- the setting ---------------------------------------------------------------------------

def test_the_config_follows_vllms_defaults_and_names_the_bad_field():
    cfg = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 3,
                                      "prompt_lookup_max": 5, "prompt_lookup_min": 5}
    one = settings.check("speculative_config", {"num_speculative_tokens": 2,
                                                "prompt_lookup_max": 4})
    assert (one["prompt_lookup_min"], one["prompt_lookup_max"]) == (4, 4)
    assert EngineConfig().speculative_config is None
    text = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2}'
    assert settings.parse_text("speculative_config", text)["prompt_lookup_max"] == 2
    flags = settings.flags_for({"speculative_config": json.loads(text)})
    assert flags[0] == "--speculative-config" and json.loads(flags[1]) == json.loads(text)


@pytest.mark.parametrize("value, message", [
    ({"method": "eagle", "num_speculative_tokens": 2},
     r"^speculative_config\.method must be one of ngram, suffix, got 'eagle'$"),
    ({"num_speculative_tokens": 0},
     r"^speculative_config\.num_speculative_tokens must be a whole number in 1\.\.16, got 0$"),
    ({"method": "ngram"}, r"^speculative_config\.num_speculative_tokens is required"),
    ({"num_speculative_tokens": 2, "prompt_lookup_minimum": 1},
     r"^speculative_config has no key 'prompt_lookup_minimum'"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     r"^speculative_config\.prompt_lookup_min \(4\) must be <= "
     r"speculative_config\.prompt_lookup_max \(2\)$"),
    ({"num_speculative_tokens": 2, "prompt_lookup_max": 0},
     r"^speculative_config\.prompt_lookup_max must be a whole number in 1\.\.64"),
    ("ngram", r"^speculative_config must be a JSON object with keys method, "),
])
def test_bad_configs_are_refused_naming_the_field(value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config=value)


def test_the_serve_flag_parses_json_and_refuses_bad_json():
    import argparse

    from engine.entrypoints.cli import add_setting_arguments

    parser = argparse.ArgumentParser()
    add_setting_arguments(parser)
    args = parser.parse_args(["--speculative-config", '{"num_speculative_tokens": 4}'])
    assert args.speculative_config["num_speculative_tokens"] == 4
    assert parser.parse_args([]).speculative_config is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", '{"num_speculative_tokens": 4'])
