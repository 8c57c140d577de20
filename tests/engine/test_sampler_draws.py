"""The sampler's draws as distributions, its random streams, its logprobs, and top-p's
threshold at float32 resolution (no model; found by scripts/mutation.py, complementing
test_sampler_oracle.py)."""
from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

CPU = torch.device("cpu")


def _seq(params: SamplingParams) -> Sequence:
    return Sequence(request_id="r", token_ids=[1, 2, 3], num_prompt_tokens=3, params=params)


def _sampler(seed: int = 0) -> Sampler:
    return Sampler(eos_token_ids=frozenset(), seed=seed, device=CPU)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_unseeded_rows_draw_independently_from_the_temperature_scaled_distribution(temperature):
    # One dominant token and eight equal ones: a draw that is not p (argmax(p * E) instead of
    # the exponential race argmax(p / E), logits * T instead of / T, rows sharing one noise
    # vector, or no noise) moves the dominant token's share by 0.1 or more.
    rows = 3000
    p = torch.tensor([0.25] + [0.75 / 8] * 8)
    logits = p.log().expand(rows, -1).contiguous()
    seqs = [_seq(SamplingParams(temperature=temperature))] * rows
    drawn = torch.bincount(torch.tensor(_sampler()(logits, seqs).token_ids), minlength=9) / rows
    expected = torch.softmax(p.log() / temperature, dim=-1)
    assert (drawn - expected).abs().max() < 0.03, (drawn, expected)


def test_unseeded_draws_follow_the_engine_seed_not_torchs_global_generator():
    logits = torch.randn(32, 50, generator=torch.Generator().manual_seed(0))
    seqs = [_seq(SamplingParams(temperature=1.0))] * 32

    def draw(engine_seed, global_seed):
        with torch.random.fork_rng():
            torch.manual_seed(global_seed)
            return _sampler(engine_seed)(logits, seqs).token_ids

    assert draw(7, global_seed=1) == draw(7, global_seed=2)
    assert draw(8, global_seed=1) != draw(7, global_seed=1)


def test_logprobs_of_the_chosen_token_and_each_rows_own_top_k():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(1))
    expected = torch.log_softmax(logits, dim=-1)
    seqs = [_seq(SamplingParams(temperature=0, logprobs=k)) for k in (None, 0, 1, 3)]
    result = _sampler()(logits, seqs)
    chosen = logits.argmax(dim=-1).tolist()
    assert result.token_ids == chosen
    assert result.logprobs == pytest.approx([float(expected[i, c]) for i, c in enumerate(chosen)])
    top = [{int(t): pytest.approx(float(expected[i, t]))
            for t in expected[i].topk(max(k, 1)).indices} for i, k in enumerate((0, 0, 1, 3))]
    assert result.top_logprobs[0] is None
    assert result.top_logprobs[1] == {chosen[1]: pytest.approx(float(expected[1, chosen[1]]))}
    assert result.top_logprobs[2] == top[2]      # greedy: the chosen token is the top one
    assert result.top_logprobs[3] == top[3]
    # every row asking for logprobs: the top-k is still computed
    alone = _sampler()(logits[3:], seqs[3:]).top_logprobs
    assert alone == [top[3]]


@pytest.mark.parametrize("row, keep", [
    # the two low tokens' mass is float32(0.1) exactly: dropped, as transformers drops it
    ([-3.2188756465911865, -2.813410758972168, -0.10536039620637894], [False, False, True]),
    # a mass above float32(0.1) but not above float32(1) - float32(0.9): kept
    ([-2.1972243785858154, 0.0], [True, True]),
])
def test_top_p_threshold_is_one_minus_top_p_rounded_once_to_float32(row, keep):
    logits = torch.tensor([row], dtype=torch.float32)
    low_mass = float(logits[0].sort().values.softmax(-1).cumsum(-1)[len(row) - 2])
    assert low_mass >= float(torch.tensor(0.1, dtype=torch.float32))   # the boundary case
    assert low_mass <= float(1 - torch.tensor(0.9, dtype=torch.float32))
    oracle = torch.isfinite(TopPLogitsWarper(0.9)(None, logits.clone())[0])
    engine = torch.isfinite(Sampler._truncate(logits, [_seq(SamplingParams(top_p=0.9))])[0])
    assert engine.tolist() == oracle.tolist() == keep
