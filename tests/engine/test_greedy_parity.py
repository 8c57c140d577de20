"""Greedy outputs equal transformers' own `generate` on the same checkpoint."""
from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams

MAX_NEW = 24
_WORDS = "the model cache block page prefix system user token kernel batch decode".split()


def _prompts(seed: int = 7, count: int = 18) -> list[str]:
    rng = random.Random(seed)
    shared = " ".join(rng.choice(_WORDS) for _ in range(20))  # a common prefix for the cache
    out = []
    for i in range(count):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.choice([1, 3, 9, 20, 40, 70])))
        out.append(f"{shared} {words}" if i % 3 == 0 else words)
    return out


@pytest.fixture(scope="module")
def references(tiny_checkpoints):
    """transformers' greedy continuation of every prompt, per family (prompts one by one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    refs = {}
    for family, path in tiny_checkpoints.items():
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        family_refs = []
        for prompt in _prompts():
            ids = tok(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
            family_refs.append(out[0, ids.shape[1]:].tolist())
        refs[family] = family_refs
    return refs


VARIANTS = {
    "bs16": dict(block_size=16),
    "bs1-noprefix": dict(block_size=1, enable_prefix_caching=False),
    "bs32": dict(block_size=32),
    "bs16-noprefix": dict(block_size=16, enable_prefix_caching=False),
    # max_num_seqs <= max_num_batched_tokens: vLLM's rule, which EngineConfig enforces
    "chunked": dict(block_size=16, max_num_batched_tokens=24, max_num_seqs=24),
    "chunked-bs1": dict(block_size=1, max_num_batched_tokens=7, max_num_seqs=7),
    # one max-length sequence fits, 18 concurrent ones do not: forces preemption
    "preempt": dict(block_size=16, num_gpu_blocks_override=16, max_num_batched_tokens=64,
                    max_num_seqs=32),
    "preempt-noprefix": dict(block_size=16, num_gpu_blocks_override=16, enable_prefix_caching=False),
}


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_transformers(family, variant, tiny_checkpoints, references):
    # float32 as the references (the CPU default already; on CUDA it runs the Triton kernels
    # with exact fp32 dots, which is how scripts/gpu_check.sh checks them there).
    kwargs = dict(num_gpu_blocks_override=512, max_model_len=256, dtype="float32")
    kwargs.update(VARIANTS[variant])
    llm = LLM(model=tiny_checkpoints[family], **kwargs)
    outputs = llm.generate(_prompts(), SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == references[family]
    stats = llm.llm_engine.get_stats()
    if variant.startswith("preempt"):
        assert stats.num_preemptions > 0, "the small pool should have forced preemptions"
    if variant == "chunked":  # later prompts are admitted after the shared prefix is cached
        assert stats.prefix_cache_hits > 0, "the shared prefix should have been served from cache"
    if variant.startswith("chunked"):
        longest = max(len(llm.get_tokenizer()(p).input_ids) for p in _prompts())
        assert longest > kwargs["max_num_batched_tokens"], "some prompt must need chunking"
