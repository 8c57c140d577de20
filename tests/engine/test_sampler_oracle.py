"""The sampler alone (no model): truncation masks against transformers' warpers, penalties
against their formulas, and seeded draws against neighbours."""
from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

VOCAB = 50


def _oracle(row: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """transformers' generate order: TopK -> TopP -> MinP, each only when switched on."""
    scores = row.unsqueeze(0).clone()
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    if min_p > 0.0:
        scores = MinPLogitsWarper(min_p)(None, scores)
    return torch.isfinite(scores[0])


def _seq(params: SamplingParams, prompt=(1, 2, 3), output=(), index: int = 0) -> Sequence:
    ids = list(prompt) + list(output)
    return Sequence(request_id="r", token_ids=ids, num_prompt_tokens=len(prompt),
                    params=params, index=index)


def _engine_mask(logits: torch.Tensor, settings: list[tuple[int, float, float]]) -> torch.Tensor:
    seqs = [_seq(SamplingParams(top_k=k, top_p=p, min_p=m)) for k, p, m in settings]
    return torch.isfinite(Sampler._truncate(logits, seqs))


def _random_setting(gen: torch.Generator) -> tuple[int, float, float]:
    """Each option on for about half the rows, so every batch mixes users and non-users."""
    r = torch.rand(6, generator=gen).tolist()
    top_k = int(r[1] * 60) + 1 if r[0] < 0.5 else -1  # up to beyond the vocabulary
    top_p = 0.05 + 0.95 * r[3] if r[2] < 0.5 else 1.0
    min_p = r[5] * 0.5 if r[4] < 0.5 else 0.0
    return top_k, top_p, min_p


@pytest.mark.parametrize("seed", range(40))
def test_masks_equal_transformers_warpers_batched_and_mixed(seed):
    gen = torch.Generator().manual_seed(seed)
    rows = 8
    logits = torch.randn(rows, VOCAB, generator=gen) * (0.5 + 3 * torch.rand(1, generator=gen))
    settings = [_random_setting(gen) for _ in range(rows)]
    settings[0] = (-1, 1.0, 0.0)  # always at least one row that uses nothing
    mask = _engine_mask(logits, settings)
    for i, (k, p, m) in enumerate(settings):
        assert torch.equal(mask[i], _oracle(logits[i], k, p, m)), (i, k, p, m)
        if k <= 0 and p >= 1 and m <= 0:
            assert bool(mask[i].all())


@pytest.mark.parametrize("k, p, m", [
    (2, 1.0, 0.0), (-1, 0.7, 0.0), (-1, 1.0, 0.3), (3, 0.6, 0.0), (5, 0.9, 0.2), (-1, 0.8, 0.1),
])
def test_each_combination_alone_matches_transformers(k, p, m):
    gen = torch.Generator().manual_seed(k * 100 + int(p * 10) + int(m * 10))
    logits = torch.randn(16, VOCAB, generator=gen) * 2
    mask = _engine_mask(logits, [(k, p, m)] * 16)
    for i in range(16):
        assert torch.equal(mask[i], _oracle(logits[i], k, p, m))


def test_top_p_applies_to_the_distribution_renormalised_after_top_k():
    logits = torch.tensor([[.3, .25, .2, .15, .1]]).log()
    keep = _engine_mask(logits, [(2, 0.5, 0.0)])[0]
    assert keep.tolist() == [True, False, False, False, False]  # not {0, 1}
    assert torch.equal(keep, _oracle(logits[0], 2, 0.5, 0.0))


def test_edge_values_top_p_one_top_k_beyond_vocab_and_ties():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=gen)
    huge = 9223372036854775808  # beyond int64: clamped before any tensor is made
    assert bool(_engine_mask(logits, [(-1, 1.0, 0.0), (VOCAB, 1.0, 0.0), (huge, 1.0, 0.0)]).all())
    # ties at the k-th value all survive, as in transformers
    tied = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    keep = _engine_mask(tied, [(2, 1.0, 0.0)])[0]
    assert keep.tolist() == [True, True, True, True, False, False]
    assert torch.equal(keep, _oracle(tied[0], 2, 1.0, 0.0))
    # a uniform row: which tied tokens top-p keeps is arbitrary, how many is not
    flat = torch.zeros(1, 10)
    for p in (0.25, 0.5, 0.95):
        assert int(_engine_mask(flat, [(-1, p, 0.0)]).sum()) == int(_oracle(flat[0], -1, p, 0.0).sum())
    # min-p ties with the top token survive; the top token always survives
    assert _engine_mask(tied, [(-1, 1.0, 1.0)])[0].tolist() == [True] + [False] * 5
    assert _engine_mask(torch.tensor([[1.0, 1.0, 0.0]]), [(-1, 1.0, 1.0)])[0].tolist() == [True, True, False]
    assert _engine_mask(tied, [(1, 1e-9, 1.0)])[0].tolist() == [True] + [False] * 5


def _penalised(params: SamplingParams, prompt, output, logits):
    sampler = Sampler(eos_token_ids=frozenset(), seed=0, device=torch.device("cpu"))
    out = logits.clone().unsqueeze(0)
    sampler._apply_penalties(out, [_seq(params, prompt, output)])
    return out[0]


PROMPT, OUTPUT = [1, 2, 2, 7], [2, 3, 3, 3, 5]


def test_repetition_penalty_formula_on_prompt_and_output_tokens():
    logits = torch.linspace(-2, 2, 10)  # negative and positive logits
    got = _penalised(SamplingParams(repetition_penalty=1.5), PROMPT, OUTPUT, logits)
    expected = logits.clone()
    for t in {1, 2, 3, 5, 7}:
        expected[t] = logits[t] / 1.5 if logits[t] > 0 else logits[t] * 1.5
    assert torch.allclose(got, expected)


def test_presence_penalty_formula_on_generated_tokens_only():
    logits = torch.linspace(-2, 2, 10)
    got = _penalised(SamplingParams(presence_penalty=0.7), PROMPT, OUTPUT, logits)
    expected = logits.clone()
    for t in {2, 3, 5}:  # the prompt's 1 and 7 are not penalised
        expected[t] -= 0.7
    assert torch.allclose(got, expected)


def test_frequency_penalty_formula_on_generated_tokens_only():
    logits = torch.linspace(-2, 2, 10)
    got = _penalised(SamplingParams(frequency_penalty=-0.4), PROMPT, OUTPUT, logits)
    expected = logits.clone()
    for t, count in {2: 1, 3: 3, 5: 1}.items():
        expected[t] += 0.4 * count
    assert torch.allclose(got, expected)


def test_all_penalties_together_and_no_output_yet():
    logits = torch.linspace(-2, 2, 10)
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    got = _penalised(params, PROMPT, OUTPUT, logits)
    expected = logits.clone()
    for t in {1, 2, 3, 5, 7}:
        expected[t] = logits[t] / 2 if logits[t] > 0 else logits[t] * 2
    for t, count in {2: 1, 3: 3, 5: 1}.items():
        expected[t] -= 0.5 + 0.25 * count
    assert torch.allclose(got, expected)
    before_output = _penalised(SamplingParams(presence_penalty=2.0, frequency_penalty=2.0),
                               PROMPT, [], logits)
    assert torch.equal(before_output, logits)


def _draws(rows: list[Sequence], steps: int, logits: torch.Tensor) -> list[list[int]]:
    sampler = Sampler(eos_token_ids=frozenset(), seed=123, device=torch.device("cpu"))
    batch = logits[: len(rows)]
    return [sampler(batch, rows).token_ids for _ in range(steps)]


def test_seeded_rows_draw_independently_of_their_neighbours():
    logits = torch.zeros(4, 200)  # flat: every draw is decided by the noise alone
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = [d[0] for d in _draws([_seq(seeded)], 6, logits)]
    mixed = _draws([_seq(SamplingParams(temperature=1.0)), _seq(SamplingParams(temperature=0.7, seed=5)),
                    _seq(seeded), _seq(SamplingParams(temperature=0, top_p=0.5))], 6, logits)
    assert [d[2] for d in mixed] == alone
    assert len(set(alone)) > 1  # the stream advances
    other = [d[0] for d in _draws([_seq(SamplingParams(temperature=1.0, seed=43))], 6, logits)]
    assert other != alone
    # sample i of a request seeded s draws as a request seeded s + i does
    sibling = [d[0] for d in _draws([_seq(seeded, index=1)], 6, logits)]
    assert sibling == other


def test_every_option_batched_with_rows_that_do_not_use_it():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 300, generator=gen)
    rows = [_seq(SamplingParams(temperature=0.8, top_p=0.9)),
            _seq(SamplingParams(temperature=0)),
            _seq(SamplingParams(temperature=1.2, top_k=3, min_p=0.05, seed=1), output=[4, 4]),
            _seq(SamplingParams(temperature=1.0, logprobs=2), output=[9]),
            _seq(SamplingParams(temperature=0.5, min_p=0.2, presence_penalty=1.0, frequency_penalty=0.5,
                                repetition_penalty=1.2), output=[8, 8]),
            _seq(SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[7]))]
    sampler = Sampler(eos_token_ids=frozenset({0}), seed=0, device=torch.device("cpu"))
    for _ in range(20):
        result = sampler(logits, rows)
        assert result.token_ids[1] == int(logits[1].argmax())
        assert result.token_ids[2] in set(logits[2].topk(3).indices.tolist())
        assert result.token_ids[5] not in (0, 7)
        assert set(result.top_logprobs[3]) >= set(torch.log_softmax(logits[3], -1).topk(2).indices.tolist())
        assert result.top_logprobs[0] is None


def test_min_tokens_bans_eos_and_stop_ids_until_reached_unless_ignore_eos():
    logits = torch.zeros(1, 10)
    logits[0, 2] = 10.0  # eos, by far the most likely
    logits[0, 3] = 9.0  # a stop id, next
    sampler = Sampler(eos_token_ids=frozenset({2}), seed=0, device=torch.device("cpu"))

    def pick(output, **kw):
        seq = _seq(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3], **kw),
                   output=output)
        return sampler(logits, [seq]).token_ids[0]

    assert pick([]) not in (2, 3)
    assert pick([5]) not in (2, 3)  # one generated token: still below min_tokens=2
    assert pick([5, 5]) == 2  # reached: eos allowed again
    assert pick([5], ignore_eos=True) == 2  # eos is not banned when it is ignored anyway
    assert SamplingParams(top_k=0).top_k == 0
    assert bool(_engine_mask(torch.randn(2, VOCAB), [(0, 1.0, 0.0), (-1, 1.0, 0.0)]).all())


@pytest.mark.parametrize("params, output", [
    (dict(logit_bias={3: 5.0}), ()),
    (dict(repetition_penalty=1.3), ()),
    (dict(presence_penalty=0.5), (4,)),
    (dict(frequency_penalty=0.5), (4,)),
    (dict(min_tokens=2), (4,)),
])
def test_a_row_with_a_processor_never_writes_the_callers_logits(params, output):
    """`process` works on a copy when a row has a processor: the caller's logits (which the
    engine and a speculative verifier read again) are left as they were, the processed row
    differs and the other row is its raw logits."""
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    seqs = [_seq(SamplingParams(temperature=0)),
            _seq(SamplingParams(temperature=0, **params), prompt=(3, 5), output=output)]
    sampler = Sampler(eos_token_ids=frozenset({0}), seed=0, device=torch.device("cpu"))
    processed = sampler.process(logits, seqs)
    assert torch.equal(logits, before)
    assert torch.equal(processed[0], before[0])
    assert not torch.equal(processed[1], before[1])
    sampler(logits, seqs)
    assert torch.equal(logits, before)


def test_rows_without_a_processor_get_the_callers_logits_back_uncopied():
    """Neutral penalties, min_tokens already reached, an empty logit_bias: nothing writes,
    so `process` hands back the caller's tensor itself (the docstring's promise)."""
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    seqs = [_seq(SamplingParams(temperature=0.7, top_p=0.9)),
            _seq(SamplingParams(min_tokens=1, logit_bias={}), output=(4,)),
            _seq(SamplingParams(repetition_penalty=1.0, presence_penalty=0.0,
                                frequency_penalty=0.0, min_tokens=2), output=(4, 6))]
    sampler = Sampler(eos_token_ids=frozenset({0}), seed=0, device=torch.device("cpu"))
    assert sampler.process(logits, seqs) is logits


def test_the_distribution_of_a_greedy_row_is_one_hot_on_its_argmax():
    """What a speculative verifier reads for a temperature-0 row: all mass on the argmax,
    next to a sampled row's softmax(logits / T)."""
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    seqs = [_seq(SamplingParams(temperature=0)), _seq(SamplingParams(temperature=0.5))]
    sampler = Sampler(eos_token_ids=frozenset(), seed=0, device=torch.device("cpu"))
    probs = sampler.distribution(logits, seqs)
    assert torch.equal(probs[0], torch.nn.functional.one_hot(logits[0].argmax(), VOCAB).float())
    assert torch.allclose(probs[1], torch.softmax(logits[1] / 0.5, -1))


def test_a_forgotten_sequence_leaves_no_seeded_stream_behind():
    sampler = Sampler(eos_token_ids=frozenset(), seed=0, device=torch.device("cpu"))
    seq = _seq(SamplingParams(temperature=1.0, seed=7))
    sampler(torch.zeros(1, VOCAB), [seq])
    assert set(sampler.snapshot([seq])[1]) == {seq.seq_id}
    sampler.forget(seq)
    assert sampler.snapshot([seq]) == (0, {})
