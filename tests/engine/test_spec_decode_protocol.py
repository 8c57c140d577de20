"""The proposer protocol (engine/spec_decode/proposer.py): the scheduler drives any class
that has its calls, a method is found by name in one registry, and the scheduler tells the
proposer once when a sequence leaves."""
from __future__ import annotations

import pytest

from engine.kv_cache_manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.spec_decode import proposer as registry
from engine.spec_decode.ngram_proposer import NgramProposer
from engine.spec_decode.proposer import Proposer, make_proposer


class FixedDrafts:
    """A stand-in third method (a draft model would sit here): always drafts 7, 8, 9."""
    num_speculative_tokens = 3

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.left: list[str] = []

    @classmethod
    def from_config(cls, config: dict) -> "FixedDrafts":
        return cls()

    def draft(self, seq, room, batch_size):
        self.calls.append((room, batch_size))
        return [7, 8, 9][:room]

    def finished(self, seq):
        self.left.append(seq.request_id)


def test_a_registered_method_is_built_by_name_and_driven_by_the_scheduler(monkeypatch):
    monkeypatch.setitem(registry.METHODS, "fixed", f"{__name__}:FixedDrafts")
    proposer = make_proposer({"method": "fixed", "num_speculative_tokens": 3})
    assert isinstance(proposer, FixedDrafts) and isinstance(proposer, Proposer)
    kv = KVCacheManager(64, 4, True)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, proposer=proposer)
    seqs = [Sequence(request_id=r, token_ids=[1, 2, 3, 4, 5], num_prompt_tokens=5,
                     params=SamplingParams(max_tokens=100)) for r in "ab"]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()  # prefill: no drafts
    assert batch.draft_token_ids == [[], []] and proposer.calls == []
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        sched.advance(s, n)
        s.token_ids.append(6)
    batch = sched.schedule()
    assert batch.draft_token_ids == [[7, 8, 9], [7, 8, 9]]
    assert batch.num_new_tokens == [4, 4] and [b for _, b in proposer.calls] == [2, 2]
    sched.finish(seqs[0], "abort")
    assert proposer.left == ["a"]


def test_a_batch_counts_the_rows_the_proposer_was_asked_for_and_offered_none():
    """batch.lookups (engine/step_shape.py's lookup_seqs): decode rows whose proposer ran
    and drafted nothing; rows that drafted, prefill rows and rows with no room (one token
    left of max_tokens) are not counted."""
    class EveryOther(FixedDrafts):
        def draft(self, seq, room, batch_size):
            self.calls.append((room, batch_size))
            return [] if seq.request_id in "ac" else [7, 8, 9][:room]

    proposer = EveryOther()
    kv = KVCacheManager(64, 4, True)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64, proposer=proposer)
    seqs = [Sequence(request_id=r, token_ids=[1, 2, 3, 4, 5], num_prompt_tokens=5,
                     params=SamplingParams(max_tokens=2 if r == "d" else 100)) for r in "abcd"]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert batch.lookups == 0
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        sched.advance(s, n)
        s.token_ids.append(6)
    late = Sequence(request_id="e", token_ids=[1, 2, 3], num_prompt_tokens=3,
                    params=SamplingParams(max_tokens=100))
    sched.add(late)
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == list("abcde")
    assert batch.draft_token_ids == [[], [7, 8, 9], [], [], []]
    assert len(proposer.calls) == 3 and batch.lookups == 2     # a and c; d had no room
    from engine.step_shape import StepShape
    shape = StepShape.of(batch)
    assert (shape.lookup_seqs, shape.draft_seqs, shape.decode_seqs) == (2, 1, 4)


def test_the_built_in_methods_are_proposers_and_an_unknown_one_is_refused():
    assert make_proposer(None) is None
    ngram = make_proposer({"method": "ngram", "num_speculative_tokens": 2,
                           "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    assert isinstance(ngram, NgramProposer) and isinstance(ngram, Proposer)
    assert ngram.num_speculative_tokens == 2
    with pytest.raises(ValueError, match=r"speculative_config\.method must be one of .*'x'"):
        make_proposer({"method": "x", "num_speculative_tokens": 2})


def test_a_config_without_a_method_is_ngram_and_an_unknown_one_is_named():
    proposer = make_proposer({"num_speculative_tokens": 2, "prompt_lookup_min": 1,
                              "prompt_lookup_max": 2})
    assert isinstance(proposer, NgramProposer) and proposer.num_speculative_tokens == 2
    with pytest.raises(ValueError, match=r"^speculative_config\.method must be one of "
                                         r"ngram, suffix, got 'eagle'$"):
        make_proposer({"method": "eagle", "num_speculative_tokens": 2})


def test_the_counters_start_at_zero_and_add_up():
    from engine.spec_decode.stats import SpecDecodeStats
    stats = SpecDecodeStats(3)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
            stats.accepted_per_pos, stats.acceptance_rate) == (0, 0, 0, [0, 0, 0], 0.0)
    stats.observe(3, 2)
    stats.observe(2, 0)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
            stats.accepted_per_pos) == (2, 5, 2, [1, 1, 0])
    assert stats.acceptance_rate == pytest.approx(0.4)
