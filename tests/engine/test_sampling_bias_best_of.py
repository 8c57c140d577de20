"""logit_bias and best_of against their definitions, batched with rows that use neither."""
from __future__ import annotations

import math

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampler import Sampler
from engine.sequence import Sequence


def _seq(params: SamplingParams, prompt=(1, 2, 3)) -> Sequence:
    return Sequence(request_id="r", token_ids=list(prompt), num_prompt_tokens=len(prompt),
                    params=params)


def test_logit_bias_is_added_before_everything_else():
    """The chosen logprob is log_softmax(logits + bias)[chosen]; greedy picks the biased
    argmax; a penalised row gets its bias before the repetition penalty; a row without a
    bias in the same batch is what it is alone."""
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(3, vocab)
    bias = {7: 9.0, 3: -100.0, 11: 2.5}
    biased = SamplingParams(temperature=0, logit_bias=bias)
    plain = SamplingParams(temperature=0)
    penalised = SamplingParams(temperature=0, logit_bias={2: 3.0}, repetition_penalty=2.0)
    sampler = Sampler(eos_token_ids=frozenset(), seed=0, device=torch.device("cpu"))
    r = sampler(logits, [_seq(biased), _seq(plain), _seq(penalised)])

    expected = logits[0].clone()
    for t, b in bias.items():
        expected[t] += b
    assert r.token_ids[0] == int(expected.argmax()) == 7
    assert math.isclose(r.logprobs[0], float(torch.log_softmax(expected, -1)[7]), abs_tol=1e-5)

    alone = sampler(logits[1:2], [_seq(plain)])
    assert (r.token_ids[1], r.logprobs[1]) == (alone.token_ids[0], alone.logprobs[0])

    row = logits[2].clone()
    row[2] += 3.0  # bias first, then the penalty on the seen tokens 1, 2, 3
    for t in (1, 2, 3):
        row[t] = row[t] / 2.0 if row[t] > 0 else row[t] * 2.0
    assert r.token_ids[2] == int(row.argmax())
    assert math.isclose(r.logprobs[2], float(torch.log_softmax(row, -1)[r.token_ids[2]]),
                        abs_tol=1e-5)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, logit_bias={4: 50.0}), SamplingParams(temperature=0,
                                                                       repetition_penalty=3.0),
    SamplingParams(temperature=0, min_tokens=2), SamplingParams(temperature=0)])
def test_the_callers_logits_are_never_written(params):
    """Processors work on a copy (made only when some row has one): the runner's logits stay
    as the model gave them, whichever processor a batch uses."""
    torch.manual_seed(1)
    logits = torch.randn(2, 20)
    before = logits.clone()
    sampler = Sampler(eos_token_ids=frozenset({4}), seed=0, device=torch.device("cpu"))
    r = sampler(logits, [_seq(params, prompt=(1, 4, 5)), _seq(SamplingParams(temperature=0))])
    assert torch.equal(logits, before)
    assert r.token_ids[1] == int(before[1].argmax())
    if params.logit_bias:
        assert r.token_ids[0] == 4


def test_logit_bias_shifts_sampled_frequencies():
    """Sampling (temperature 1) with a bias b on token t: its probability is
    softmax(logits + b)[t]; 4000 draws land within 5 standard errors."""
    logits = torch.zeros(1, 8)
    p = SamplingParams(temperature=1.0, logit_bias={5: math.log(9.0)})  # 9 / (9 + 7)
    sampler = Sampler(eos_token_ids=frozenset(), seed=1, device=torch.device("cpu"))
    draws = 4000
    hits = sampler(logits.expand(draws, 8), [_seq(p) for _ in range(draws)]).token_ids.count(5)
    expected = 9 / 16
    assert abs(hits / draws - expected) < 5 * math.sqrt(expected * (1 - expected) / draws)


def test_bad_logit_bias_and_best_of():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: 101.0})
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={-1: 1.0})
    with pytest.raises(ValueError, match="best_of"):
        SamplingParams(n=3, best_of=2)


@pytest.fixture(scope="module")
def llm(tiny_checkpoints):
    return LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=128, seed=0,
               max_num_seqs=16)


def test_best_of_returns_the_n_best_of_what_n_equal_best_of_samples(llm):
    """Sample i of a request seeded s draws with seed s + i, so best_of=5, n=2 samples the
    same five sequences as n=5; it must return the two of highest cumulative logprob, in
    that order. Batched with a plain request, which is unchanged."""
    prompt = {"prompt_token_ids": [5, 17, 42, 99, 7, 3]}
    common = dict(temperature=1.0, seed=123, max_tokens=6, ignore_eos=True, logprobs=0)
    all5 = llm.generate([prompt], SamplingParams(n=5, **common))[0].outputs
    plain = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate([prompt, prompt], [SamplingParams(n=2, best_of=5, **common), plain])
    best = sorted(all5, key=lambda c: -c.cumulative_logprob)[:2]
    assert [c.token_ids for c in outs[0].outputs] == [c.token_ids for c in best]
    assert [c.index for c in outs[0].outputs] == [0, 1]
    for c in outs[0].outputs:  # cumulative logprob is the sum of the chosen tokens' logprobs
        assert math.isclose(c.cumulative_logprob,
                            sum(lp[t] for t, lp in zip(c.token_ids, c.logprobs)), abs_tol=1e-4)
    alone = llm.generate([prompt], plain)[0].outputs[0]
    assert outs[1].outputs[0].token_ids == alone.token_ids
    assert len({tuple(c.token_ids) for c in all5}) > 2  # the samples do differ
