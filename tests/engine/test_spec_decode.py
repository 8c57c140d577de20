"""Speculative decoding end to end: greedy output equals transformers' own generate (the
oracle) with n-gram drafts accepted, on every family and the paged-cache variants; rows with
and without drafts, prefill chunks and forks share steps; rejected drafts leave no block."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams

MAX_NEW = 32
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}
_WORDS = "the model cache block page prefix system user token kernel batch decode".split()


def _prompts() -> list[str]:
    """Repetitive prompts (summaries copy, code repeats itself) and a few that are not, so
    that steps mix rows with drafts and rows without."""
    out = []
    for i in range(10):
        words = [_WORDS[(i * 5 + j * 7) % len(_WORDS)] for j in range(3 + i % 4)]
        unit = " ".join(words)
        out.append(" ".join([unit] * (2 + i % 3)) if i % 4 else unit)
    out.append(" ".join(_WORDS * 5))  # a long one: chunked across steps in "chunked"
    return out


@pytest.fixture(scope="module")
def references(tiny_checkpoints):
    """transformers' greedy continuation of every prompt, per family."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    refs = {}
    for family, path in tiny_checkpoints.items():
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        refs[family] = []
        for prompt in _prompts():
            ids = tok(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
            refs[family].append(out[0, ids.shape[1]:].tolist())
    return refs


def _record_steps(llm: LLM) -> list[tuple[int, int, int]]:
    """Per step: (rows with drafts, decode rows without, prefill rows), and the cache
    invariants checked after every step."""
    engine = llm.llm_engine
    shapes = []
    schedule, step = engine.scheduler.schedule, engine.step

    def recording_schedule():
        batch = schedule()
        drafts = batch.draft_token_ids or [[]] * len(batch.seqs)
        spec = sum(1 for d in drafts if d)
        prefill = sum(1 for s, d, n in zip(batch.seqs, drafts, batch.num_new_tokens)
                      if not d and s.num_output_tokens == 0)
        shapes.append((spec, len(batch.seqs) - spec - prefill, prefill))
        return batch

    def checking_step():
        outputs = step()
        engine.check_no_leaks()
        for seq in engine.scheduler.running:  # blocks for computed tokens only
            assert len(seq.block_table) == engine.kv.blocks_for(seq.num_computed_tokens)
        return outputs

    engine.scheduler.schedule = recording_schedule
    engine.step = checking_step
    return shapes


VARIANTS = {
    "bs16": dict(block_size=16),
    "bs1-noprefix": dict(block_size=1, enable_prefix_caching=False),
    "chunked": dict(block_size=16, max_num_batched_tokens=24, max_num_seqs=12),
    # one max-length sequence fits, the batch does not: preemption with drafts in flight
    "preempt": dict(block_size=16, num_gpu_blocks_override=18, max_num_batched_tokens=64,
                    max_num_seqs=32),
}


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_with_drafts_matches_transformers(family, variant, tiny_checkpoints,
                                                 references):
    kwargs = dict(num_gpu_blocks_override=512, max_model_len=256, dtype="float32",
                  speculative_config=SPEC)
    kwargs.update(VARIANTS[variant])
    llm = LLM(model=tiny_checkpoints[family], **kwargs)
    shapes = _record_steps(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = llm.generate(_prompts(), params)
    assert [o.outputs[0].token_ids for o in outputs] == references[family]
    stats = llm.llm_engine.get_stats()
    assert stats.spec_num_accepted_tokens > 0, "repetitive prompts should get drafts accepted"
    assert stats.spec_num_draft_tokens > stats.spec_num_accepted_tokens, "and some rejected"
    per_pos = stats.spec_num_accepted_tokens_per_pos
    assert sum(per_pos) == stats.spec_num_accepted_tokens and list(per_pos) == sorted(
        per_pos, reverse=True), per_pos  # position j is accepted only after j - 1
    assert any(spec and plain for spec, plain, _ in shapes), "rows with and without drafts"
    if variant == "chunked":
        assert any(spec and prefill for spec, _, prefill in shapes), "drafts beside a prefill"
    if variant == "preempt":
        assert stats.num_preemptions > 0


def test_n_samples_and_a_mixed_batch_keep_greedy_parity(tiny_checkpoints, references):
    """n = 2 greedy samples fork after the prompt and speculate separately (their shared
    partial block is copied on the first write); a request with max_tokens 1 beside them
    never gets drafts."""
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=256, max_model_len=256,
              dtype="float32", block_size=8, speculative_config=SPEC)
    _record_steps(llm)
    prompts = _prompts()[:6]
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_NEW, n=2) if i % 2 else
              SamplingParams(temperature=0.0, max_tokens=1) for i in range(len(prompts))]
    outputs = llm.generate(prompts, params)
    for i, out in enumerate(outputs):
        expected = references["llama"][i][:params[i].max_tokens]
        assert [c.token_ids for c in out.outputs] == [expected] * params[i].n
    stats = llm.llm_engine.get_stats()
    assert stats.spec_num_accepted_tokens > 0 and stats.cow_copies > 0


def test_cached_blocks_hold_only_accepted_tokens(tiny_checkpoints, references):
    """Every block the prefix cache holds after runs with rejected drafts hashes to real
    tokens (prompt + output) of some request, and a second identical batch reads them back
    and still matches the oracle."""
    from engine.kv_cache_manager import hash_block

    llm = LLM(model=tiny_checkpoints["qwen2"], num_gpu_blocks_override=512, max_model_len=256,
              dtype="float32", block_size=2, speculative_config=SPEC)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = llm.generate(_prompts(), params)
    engine = llm.llm_engine
    assert engine.get_stats().spec_num_draft_tokens > engine.get_stats().spec_num_accepted_tokens
    real = set()
    for out in outputs:
        tokens = out.prompt_token_ids + out.outputs[0].token_ids
        parent = None
        for i in range(len(tokens) // 2):
            parent = hash_block(parent, tokens[2 * i:2 * i + 2], None)
            real.add(parent)
    cached = [b.block_hash for b in engine.kv.blocks if b.block_hash is not None]
    assert cached and set(cached) <= real
    again = llm.generate(_prompts(), params)
    assert [o.outputs[0].token_ids for o in again] == references["qwen2"]
    assert all(o.num_cached_tokens > 0 for o in again if len(o.prompt_token_ids) > 2)
