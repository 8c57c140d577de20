"""The adaptive draft length (adaptive_draft_knee, engine/spec_decode/gate.py): it shrinks
as the measured acceptance drops and as the batch grows, falls to zero when drafting costs
more than it saves, probes back, and never changes the output."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.sequence import Sequence
from engine.spec_decode.gate import ALPHA_PRIOR, DraftGate, best_length
from engine.spec_decode.proposer import make_proposer
from test_spec_decode import MAX_NEW, _prompts, references  # noqa: F401


def test_best_length_shrinks_as_acceptance_drops_and_as_the_batch_grows():
    by_alpha = [best_length(a, 4, 64, 8) for a in (0.95, 0.8, 0.6, 0.4, 0.2, 0.0)]
    assert by_alpha == sorted(by_alpha, reverse=True) and by_alpha[0] == 8 and by_alpha[-1] == 0
    assert len(set(by_alpha)) >= 4, by_alpha  # in steps, not a switch
    by_batch = [best_length(0.8, b, 64, 8) for b in (1, 4, 16, 64, 256, 1024)]
    assert by_batch == sorted(by_batch, reverse=True) and by_batch[0] == 8
    assert by_batch[-1] == 0, by_batch  # verification costs more than it saves
    assert len(set(by_batch)) >= 3, by_batch
    # the figure it maximises, checked by hand at one point: alpha 0.5, batch 8, knee 16:
    # k = 0: 1 / 1.5 = 0.667; k = 1: 1.5 / 2 = 0.75; k = 2: 1.75 / 2.5 = 0.7
    assert best_length(0.5, 8, 16, 4) == 1
    assert best_length(0.0, 1, 1_000_000, 4) == 0  # nothing accepted: nothing gained


def _seq() -> Sequence:
    return Sequence(request_id="A", token_ids=[1, 2, 3] * 4, num_prompt_tokens=11,
                    params=SamplingParams(max_tokens=10_000))


def test_a_sequence_whose_drafts_are_rejected_drafts_less_then_probes():
    gate = DraftGate(adaptive_draft_knee=32, acceptance_probe_interval=3)
    seq = _seq()
    lengths = []
    for _ in range(16):  # the gate's calls as a proposer makes them; every draft rejected
        assert gate.allows(seq, 2)
        k = gate.length(seq, 2, 6)
        lengths.append(k)
        gate.handed_out(seq, [9] * k)
        seq.token_ids.append(7)
    assert lengths[0] == 6  # the prior (alpha 0.8) at batch 2
    first_zero = lengths.index(0)
    assert lengths[:first_zero] == sorted(lengths[:first_zero], reverse=True)
    assert lengths[:4] == [6, 3, 2, 1]  # alpha 0.8, 0.49, 0.33, 0.24: each rejection costs
    assert lengths[first_zero:first_zero + 4] == [0, 0, 0, 1]  # three steps held, a probe
    assert gate._states[seq].alpha < ALPHA_PRIOR[0] / ALPHA_PRIOR[1] / 4
    # an accepted probe (the draft, then a bonus token) lengthens the next draft again
    while gate.length(seq, 2, 6) == 0:
        seq.token_ids.append(7)
    gate.handed_out(seq, [9])
    before = gate._states[seq].alpha
    seq.token_ids += [9, 1]
    gate.allows(seq, 2)
    assert gate._states[seq].alpha > before


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_both_methods_draft_the_gates_length(method):
    extra = {"prompt_lookup_min": 1, "prompt_lookup_max": 3} if method == "ngram" else {}
    proposer = make_proposer(EngineConfig(speculative_config={
        "method": method, "num_speculative_tokens": 6, "adaptive_draft_knee": 32,
        **extra}).speculative_config)
    seq = Sequence(request_id="A", token_ids=[1, 2, 3, 4, 5, 6, 7, 8] * 4 + [1],
                   num_prompt_tokens=32, params=SamplingParams(max_tokens=100))
    assert len(proposer.draft(seq, room=8, batch_size=1)) == 6
    assert len(proposer.draft(seq, room=8, batch_size=16)) == 3
    assert proposer.draft(seq, room=8, batch_size=128) == []


def test_accepted_drafts_keep_the_full_length_until_the_batch_is_large():
    gate = DraftGate(adaptive_draft_knee=32)
    proposer = make_proposer({"method": "ngram", "num_speculative_tokens": 4,
                              "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    proposer.gate = gate
    seq = _seq()
    for _ in range(10):
        drafts = proposer.draft(seq, room=8, batch_size=1)
        assert len(drafts) == 4
        seq.token_ids += drafts + [1]  # all accepted, then a bonus token
    assert gate._states[seq].alpha > 0.9
    assert gate.length(seq, 24, 4) == 4  # where the prior (0.8) would draft 2
    assert best_length(ALPHA_PRIOR[0] / ALPHA_PRIOR[1], 24, 32, 4) == 2


def test_the_knee_is_checked_at_start_up_naming_the_key():
    with pytest.raises(ValueError, match=r"^speculative_config\.adaptive_draft_knee must be "
                                         r"a whole number in 1\.\."):
        EngineConfig(speculative_config={"method": "suffix", "num_speculative_tokens": 4,
                                         "adaptive_draft_knee": 0})


def test_greedy_output_is_unchanged_and_fewer_drafts_are_wasted(tiny_checkpoints,
                                                                references):  # noqa: F811
    """The same two rounds with and without the adaptive length: the same output, fewer
    drafts verified and a larger share of them accepted."""
    figures = []
    for knee in (None, 4):
        spec = {"method": "suffix", "num_speculative_tokens": 4, "adaptive_draft_knee": knee}
        llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=512,
                  max_model_len=256, dtype="float32", block_size=16,
                  speculative_config={k: v for k, v in spec.items() if v is not None})
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
        for _ in range(2):
            outputs = llm.generate(_prompts(), params)
            assert [o.outputs[0].token_ids for o in outputs] == references["llama"]
        stats = llm.llm_engine.get_stats()
        figures.append((stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens))
    (drafted, accepted), (drafted_adaptive, accepted_adaptive) = figures
    assert 0 < accepted_adaptive and drafted_adaptive < drafted
    assert accepted_adaptive / drafted_adaptive > accepted / drafted
