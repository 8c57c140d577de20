"""SamplingParams.prompt_logprobs equals transformers' own forward on the same checkpoint:
every prompt position, with chunked prefill, with the prompt's prefix already in the prefix
cache, and batched with requests that do not ask for them."""
from __future__ import annotations

import math
import random

import pytest
import torch

from engine import LLM, SamplingParams

_WORDS = "the model cache block page prefix system user token kernel batch decode".split()


def _prompts(seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    shared = " ".join(rng.choice(_WORDS) for _ in range(30))  # two 16-token blocks or more
    return [f"{shared} {' '.join(rng.choice(_WORDS) for _ in range(n))}" for n in (1, 7, 19)]


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    """log_softmax of transformers' logits at every position of each prompt (llama)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_checkpoints["llama"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for prompt in _prompts():
        ids = tok(prompt).input_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        out.append((ids, torch.log_softmax(logits.float(), dim=-1)))
    return out


def _check(out, ids, ref_lps, k):
    pl = out.prompt_logprobs
    assert pl is not None and len(pl) == len(ids) and pl[0] is None
    for pos in range(1, len(ids)):
        entry = pl[pos]
        expected = ref_lps[pos - 1]
        assert math.isclose(entry[ids[pos]], float(expected[ids[pos]]), abs_tol=1e-4), pos
        top_ids = expected.topk(k).indices.tolist()
        assert set(top_ids) <= set(entry), pos  # the top k alternatives, and the token itself
        assert len(entry) <= k + 1
        for t in top_ids:
            assert math.isclose(entry[t], float(expected[t]), abs_tol=1e-4)


@pytest.mark.parametrize("variant", [
    dict(block_size=16),
    dict(block_size=16, max_num_batched_tokens=16, max_num_seqs=8),  # chunked prefill
    dict(block_size=4, enable_prefix_caching=False),
])
def test_prompt_logprobs_match_transformers(tiny_checkpoints, reference, variant):
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=128, seed=0, **variant)
    prompts = [{"prompt_token_ids": ids} for ids, _ in reference]
    # the first request fills the prefix cache with the shared prefix; then a batch where
    # rows that ask for prompt logprobs (k = 2, 0) sit beside a row that does not
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0))
    params = [SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2),
              SamplingParams(max_tokens=3, temperature=0),
              SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=0, n=2)]
    outs = llm.generate(prompts, params)
    _check(outs[0], *reference[0], k=2)
    assert outs[1].prompt_logprobs is None
    _check(outs[2], *reference[2], k=0)
    alone = llm.generate(prompts[1:2], SamplingParams(max_tokens=3, temperature=0))
    assert outs[1].outputs[0].token_ids == alone[0].outputs[0].token_ids
    # a prompt served entirely from the cache afterwards still gets every position
    again = llm.generate(prompts[:1], SamplingParams(max_tokens=1, prompt_logprobs=1))
    _check(again[0], *reference[0], k=1)


def test_prompt_logprobs_survive_preemption(tiny_checkpoints, reference):
    """A pool too small for all at once: requests are preempted and recomputed; each
    position's entry is still there once, and right."""
    llm = LLM(model=tiny_checkpoints["llama"], block_size=4, num_gpu_blocks_override=40,
              max_model_len=128, max_num_batched_tokens=16, max_num_seqs=4, seed=0)
    prompts = [{"prompt_token_ids": ids} for ids, _ in reference] * 2
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                                                prompt_logprobs=1))
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for out, (ids, lps) in zip(outs, reference * 2):
        _check(out, ids, lps, k=1)


def test_prompt_logprobs_bounds():
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
