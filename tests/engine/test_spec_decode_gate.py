"""Speculation's off-switches (engine/spec_decode/gate.py): a sequence whose drafts are
rejected stops drafting and probes again now and then, one whose drafts are accepted keeps
drafting; no drafts while the batch is at disable_by_batch_size; outputs never change."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.kv_cache_manager import KVCacheManager
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.spec_decode.gate import EMA_WEIGHT, DraftGate
from engine.spec_decode.ngram_proposer import NgramProposer


def _proposer(gate: DraftGate, k: int = 3) -> NgramProposer:
    return NgramProposer(num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=3,
                         gate=gate)


def _seq(rid: str = "A") -> Sequence:
    """Tokens from {1, 2, 3} only: with prompt_lookup_min 1 every suffix has a match."""
    return Sequence(request_id=rid, token_ids=[1, 2, 3] * 4, num_prompt_tokens=11,
                    params=SamplingParams(max_tokens=1000))


def _step(proposer: NgramProposer, seq: Sequence, *, accept: bool) -> list[int]:
    """One decode step as the engine runs it: the drafts, then the target's tokens (all
    drafts and a bonus token, or a first token that differs from the first draft)."""
    drafts = proposer.draft(seq, room=8, batch_size=1)
    if accept:
        seq.token_ids += drafts + [1]
    else:
        first = drafts[0] if drafts else 0
        seq.token_ids.append(next(t for t in (1, 2, 3) if t != first))
    return drafts


def test_a_rejected_sequence_stops_after_the_average_falls_then_probes():
    proposer = _proposer(DraftGate(min_acceptance_rate=0.5, acceptance_probe_interval=4))
    seq = _seq()
    drafted = [bool(_step(proposer, seq, accept=False)) for _ in range(13)]
    # 1 -> 0.75 -> 0.56 -> 0.42 < 0.5 after three rejected steps; then 4 steps held back,
    # a probe (rejected again: 0.32), 4 held back, a probe
    assert drafted == [True] * 3 + [False] * 4 + [True] + [False] * 4 + [True]
    assert proposer.gate.acceptance(seq) == pytest.approx((1 - EMA_WEIGHT) ** 4)


def test_an_accepted_probe_resumes_drafting_and_an_accepted_sequence_keeps_drafting():
    proposer = _proposer(DraftGate(min_acceptance_rate=0.5, acceptance_probe_interval=2))
    seq = _seq()
    for _ in range(3):
        assert _step(proposer, seq, accept=False)
    assert not _step(proposer, seq, accept=True)  # below the rate: held back
    assert not _step(proposer, seq, accept=True)
    assert _step(proposer, seq, accept=True)  # the probe, all accepted: 0.42 -> 0.57
    assert all(_step(proposer, seq, accept=True) for _ in range(20))
    assert proposer.gate.acceptance(seq) > 0.99

    always = _seq("B")
    assert all(_step(proposer, always, accept=True) for _ in range(30))


def test_partial_acceptance_counts_as_the_accepted_share():
    gate = DraftGate(min_acceptance_rate=0.1)
    proposer = _proposer(gate, k=4)
    seq = _seq()
    drafts = proposer.draft(seq, room=8, batch_size=1)
    assert len(drafts) == 4
    seq.token_ids += drafts[:1] + [next(t for t in (1, 2, 3) if t != drafts[1])]
    proposer.draft(seq, room=8, batch_size=1)
    assert gate.acceptance(seq) == pytest.approx(1 - EMA_WEIGHT * 0.75)


def test_a_step_is_counted_once_and_only_when_it_verified_the_drafts():
    gate = DraftGate(min_acceptance_rate=0.5)
    proposer = _proposer(gate)
    seq = _seq()
    drafts = proposer.draft(seq, room=8, batch_size=1)
    seq.token_ids.append(drafts[0])  # one token, equal to the first draft: not verified
    proposer.draft(seq, room=8, batch_size=1)
    assert gate.acceptance(seq) == 1.0
    for _ in range(3):
        _step(proposer, seq, accept=False)
    assert not proposer.draft(seq, room=8, batch_size=1)  # the third counted: held back
    held = gate.acceptance(seq)
    assert held < 0.5
    assert not proposer.draft(seq, room=8, batch_size=1)  # nothing new: nothing counted
    assert gate.acceptance(seq) == held


def test_without_min_acceptance_rate_a_rejected_sequence_drafts_every_step():
    proposer = _proposer(DraftGate())
    seq = _seq()
    assert all(_step(proposer, seq, accept=False) for _ in range(30))
    assert proposer.gate.acceptance(seq) is None


def test_bad_gate_settings_are_refused():
    with pytest.raises(ValueError, match="min_acceptance_rate must be in 0..1"):
        DraftGate(min_acceptance_rate=1.5)
    with pytest.raises(ValueError, match="acceptance_probe_interval must be >= 1"):
        DraftGate(acceptance_probe_interval=0)
    with pytest.raises(ValueError, match="disable_by_batch_size must be >= 1"):
        DraftGate(disable_by_batch_size=0)


def _scheduled_drafts(num_seqs: int, disable_by_batch_size: int | None) -> list[list[int]]:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256,
                      proposer=_proposer(DraftGate(disable_by_batch_size=disable_by_batch_size)))
    seqs = [_seq(str(i)) for i in range(num_seqs)]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()  # the prefills: computed but the last token
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        sched.advance(s, n - 1)
        kv.trim(s)
    return sched.schedule().draft_token_ids


def test_no_drafts_while_the_batch_is_at_disable_by_batch_size():
    assert _scheduled_drafts(3, disable_by_batch_size=3) == [[], [], []]
    assert all(_scheduled_drafts(3, disable_by_batch_size=4))
    assert all(_scheduled_drafts(3, disable_by_batch_size=None))
    assert all(_scheduled_drafts(1, disable_by_batch_size=2))


def test_the_config_keys_reach_the_gate():
    proposer = NgramProposer.from_config({
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
        "prompt_lookup_max": 2, "min_acceptance_rate": 0.4, "acceptance_probe_interval": 7,
        "disable_by_batch_size": 5})
    gate = proposer.gate
    assert (gate.min_rate, gate.probe_interval, gate.max_batch) == (0.4, 7, 5)


def test_a_mixed_batch_with_the_gate_keeps_greedy_parity(tiny_checkpoints):
    """Repetitive prompts (drafts accepted) beside ones whose drafts are rejected: the
    gate holds some sequences back, outputs equal plain greedy decoding."""
    words = "the model cache block page prefix system user token kernel batch decode".split()
    prompts = [" ".join(words[i:i + 3] * 3) if i % 2 else " ".join(words[i:] + words[:i])
               for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=40)
    kwargs = dict(model=tiny_checkpoints["llama"], num_gpu_blocks_override=256,
                  max_model_len=256, dtype="float32", block_size=4)
    plain = [o.outputs[0].token_ids for o in LLM(**kwargs).generate(prompts, params)]
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}
    free = LLM(**kwargs, speculative_config=spec)
    assert [o.outputs[0].token_ids for o in free.generate(prompts, params)] == plain
    gated = LLM(**kwargs, speculative_config={**spec, "min_acceptance_rate": 0.6,
                                               "acceptance_probe_interval": 4})
    engine = gated.llm_engine
    held_back = []
    allows = engine.scheduler.proposer.gate.allows

    def recording_allows(seq, batch_size):
        ok = allows(seq, batch_size)
        held_back.append(not ok)
        return ok

    engine.scheduler.proposer.gate.allows = recording_allows
    assert [o.outputs[0].token_ids for o in gated.generate(prompts, params)] == plain
    engine.check_no_leaks()
    assert any(held_back), "some sequence's drafts were rejected often enough"
    ungated, stats = free.llm_engine.get_stats(), engine.get_stats()
    assert 0 < stats.spec_num_draft_tokens < ungated.spec_num_draft_tokens
    rejected = lambda s: s.spec_num_draft_tokens - s.spec_num_accepted_tokens  # noqa: E731
    assert rejected(stats) < rejected(ungated)


def test_the_bounds_of_each_setting_are_allowed_and_the_defaults_hold():
    for ok in ({"min_acceptance_rate": 0.0}, {"min_acceptance_rate": 1.0},
               {"acceptance_probe_interval": 1}, {"disable_by_batch_size": 1},
               {"adaptive_draft_knee": 1}):
        DraftGate(**ok)
    with pytest.raises(ValueError, match=r"^acceptance_probe_interval must be >= 1, got 0$"):
        DraftGate(acceptance_probe_interval=0)
    with pytest.raises(ValueError, match=r"^adaptive_draft_knee must be >= 1, got 0$"):
        DraftGate(adaptive_draft_knee=0)
    assert DraftGate().probe_interval == 16 == DraftGate.from_config({}).probe_interval
    assert not DraftGate().active


def test_an_average_exactly_at_the_rate_still_drafts():
    gate = DraftGate(min_acceptance_rate=1.0)   # a new sequence's average starts at 1
    assert gate.allows(_seq(), 1)


def test_the_adaptive_length_never_exceeds_the_room_and_probes_on_schedule():
    gate = DraftGate(adaptive_draft_knee=1, acceptance_probe_interval=2)
    seq = _seq()
    # no room: nothing, however long the sequence has been held at zero
    for _ in range(6):
        assert gate.allows(seq, 64) and gate.length(seq, 64, 0) == 0
    # room for one, but a batch of 64 at knee 1: drafting costs more than it saves, so
    # zero, then a probe after two steps at zero, then the count starts again
    got = []
    for _ in range(7):
        gate.allows(seq, 64)
        got.append(gate.length(seq, 64, 1))
    assert got == [0, 0, 1, 0, 0, 1, 0]
    # a step that drafts resets the count: a batch of one makes drafting pay again
    gate.allows(seq, 1)
    assert gate.length(seq, 1, 1) == 1
    got = []
    for _ in range(3):
        gate.allows(seq, 64)
        got.append(gate.length(seq, 64, 1))
    assert got == [0, 0, 1]


def test_the_ngram_proposer_refuses_bad_bounds():
    for bad in ({"prompt_lookup_min": 3, "prompt_lookup_max": 2, "num_speculative_tokens": 1},
                {"prompt_lookup_min": 1, "prompt_lookup_max": 2, "num_speculative_tokens": 0},
                {"prompt_lookup_min": 0, "prompt_lookup_max": 2, "num_speculative_tokens": 1}):
        with pytest.raises(AssertionError):
            NgramProposer(**bad)
