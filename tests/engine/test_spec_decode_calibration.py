"""Suffix drafts cut by calibrated probabilities (engine/spec_decode/calibration.py, used by
DraftGate.cut when adaptive_draft_knee is set): what the verifier did with earlier drafts of
the same kind of evidence decides how much of the next draft is verified."""
from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.spec_decode.calibration import PRIOR, DraftCalibration, draft_keys
from engine.spec_decode.gate import DraftGate, best_cut
from engine.spec_decode.suffix_proposer import SuffixProposer


def test_keys_bucket_source_match_evidence_and_position():
    evidence = [(1.0, 1), (0.5, 2), (0.4, 3), (1.0, 4), (0.99, 9)]
    keys = draft_keys(evidence, match=5, shared=True)
    assert keys == [(1, 3, 2, 0, 0), (1, 3, 1, 1, 1), (1, 3, 0, 1, 2), (1, 3, 2, 2, 2),
                    (1, 3, 1, 2, 2)]
    matches = [draft_keys([(1.0, 1)], m, False)[0][1] for m in (1, 2, 3, 4, 5, 8, 9, 16, 17)]
    assert matches == [0, 1, 2, 2, 3, 3, 4, 4, 5]


def test_a_kind_that_is_rejected_is_trusted_less_and_unverified_tokens_teach_nothing():
    cal = DraftCalibration()
    own = draft_keys([(1.0, 1)] * 4, match=3, shared=False)
    assert cal.cumulative(own) == pytest.approx([PRIOR, PRIOR ** 2, PRIOR ** 3, PRIOR ** 4])
    for _ in range(30):
        cal.observe(own, 1)   # the first accepted, the second rejected, the rest unverified
    first, second, third = (cal.probability(k) for k in own[:3])
    assert first > 0.9 and second < 0.2
    assert third == pytest.approx(PRIOR)  # positions 3+ were never verified
    # other evidence at the same source, match and position: the coarse level's estimate
    other = draft_keys([(1.0, 1), (0.5, 2)], match=3, shared=False)[1]
    assert other != own[1] and cal.probability(other) < 0.5
    # the shared tree's drafts are another kind: untouched
    assert cal.probability(draft_keys([(1.0, 1)] * 2, 3, True)[1]) == pytest.approx(PRIOR)


def test_best_cut_stops_where_a_token_no_longer_pays_for_its_verification():
    # knee 32 at batch 1: one more token costs 1/32 of a step; worth it while p > ~1/30
    assert best_cut([1.0, 1.0, 0.02, 0.01], 1, 32) == 2
    assert best_cut([1.0, 1.0, 0.5, 0.4], 1, 32) == 4
    # a large batch makes every token dear: only sure ones are verified, or none
    assert best_cut([1.0, 1.0, 0.5, 0.4], 64, 32) == 2
    assert best_cut([0.3, 0.1], 64, 32) == 0
    assert best_cut([], 1, 32) == 0


def _copying_seq(n: int) -> Sequence:
    return Sequence(request_id=f"r{n}", token_ids=[1, 2, 3, 4, 5, 6, 7, 8] * 4 + [1],
                    num_prompt_tokens=33, params=SamplingParams(max_tokens=100))


def test_suffix_drafts_shrink_to_what_the_verifier_keeps_accepting():
    """Every draft of this text has its first two tokens accepted and the third rejected:
    the drafts (6 tokens at first, the prior's) are cut to 2, for the next requests too."""
    gate = DraftGate(adaptive_draft_knee=32)
    proposer = SuffixProposer(num_speculative_tokens=6, max_cached_requests=0, gate=gate)
    lengths = []
    for n in range(12):
        seq = _copying_seq(n)
        assert gate.allows(seq, 1)
        drafts = proposer.draft(seq, room=8, batch_size=1)
        lengths.append(len(drafts))
        seq.token_ids += drafts[:2] + [99]   # two accepted, then the target's own token
        gate.allows(seq, 1)                  # the next step's call settles the draft
    assert lengths[0] == 6 and lengths[-1] == 2, lengths
    assert lengths == sorted(lengths, reverse=True)


def test_without_the_knee_the_draft_is_whole():
    proposer = SuffixProposer(num_speculative_tokens=6, max_cached_requests=0)
    assert proposer.gate.calibration is None
    for n in range(6):
        seq = _copying_seq(n)
        drafts = proposer.draft(seq, room=8, batch_size=1)
        assert len(drafts) == 6
        seq.token_ids += drafts[:2] + [99]
