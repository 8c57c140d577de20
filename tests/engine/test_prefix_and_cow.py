"""Prefix caching computes only uncached tokens; n > 1 forks share blocks copy-on-write."""
from __future__ import annotations

import pytest

from engine import LLMEngine, SamplingParams


def _engine(path, **kw) -> LLMEngine:
    args = dict(model=path, block_size=16, num_gpu_blocks_override=128, max_model_len=256)
    args.update(kw)
    return LLMEngine.from_args(**args)


def _prefill_tokens(engine: LLMEngine, request_id: str, prompt, params, **kw) -> tuple:
    """Run one request; count the tokens the model computed for its prompt."""
    engine.add_request(request_id, prompt, params, **kw)
    seq = engine._requests[request_id].seqs[0]
    prompt_len = seq.num_prompt_tokens
    computed_for_prompt = 0
    final = None
    while engine.has_unfinished_requests():
        batch = engine.scheduler.schedule()
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            if s is seq and s.num_computed_tokens < prompt_len:
                computed_for_prompt += min(n, prompt_len - s.num_computed_tokens)
        final = _finish_step(engine, batch) or final
    return final, computed_for_prompt


def _finish_step(engine: LLMEngine, batch):
    """The second half of LLMEngine.step for a batch scheduled by the test."""
    original = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: batch
    try:
        outs = engine.step()
    finally:
        engine.scheduler.schedule = original
    return next((o for o in outs if o.finished), None)


def test_shared_prefix_computes_only_uncached_tokens(tiny_checkpoints):
    path = tiny_checkpoints["llama"]
    engine = _engine(path)
    tok = engine.tokenizer
    system = [int(t) for t in tok("the system prompt says " * 12).input_ids][:48]  # 3 blocks
    first = system + [5, 6, 7, 8, 9]
    second = system + [10, 11, 12]
    greedy = SamplingParams(temperature=0, max_tokens=8)
    out1, computed1 = _prefill_tokens(engine, "a", first, greedy)
    assert computed1 == len(first)
    out2, computed2 = _prefill_tokens(engine, "b", second, greedy)
    assert out2.num_cached_tokens == 48
    assert computed2 == len(second) - 48
    stats = engine.get_stats()
    assert stats.prefix_cache_hits == 48
    assert stats.prefix_cache_queries == len(first) + len(second)

    baseline = _engine(path, enable_prefix_caching=False)
    _, computed_off = _prefill_tokens(baseline, "b", second, greedy)
    ref, _ = _prefill_tokens(baseline, "b2", second, greedy)
    assert computed_off == len(second)
    assert out2.outputs[0].token_ids == ref.outputs[0].token_ids


def test_cache_salt_isolates_prefixes(tiny_checkpoints):
    engine = _engine(tiny_checkpoints["llama"])
    prompt = list(range(3, 40))
    greedy = SamplingParams(temperature=0, max_tokens=2)
    _prefill_tokens(engine, "a", prompt, greedy, cache_salt="tenant-a")
    out, computed = _prefill_tokens(engine, "b", prompt, greedy, cache_salt="tenant-b")
    assert out.num_cached_tokens == 0 and computed == len(prompt)
    out, computed = _prefill_tokens(engine, "c", prompt, greedy, cache_salt="tenant-a")
    assert out.num_cached_tokens == 32 and computed == len(prompt) - 32


def test_whole_prompt_cached_still_computes_last_token(tiny_checkpoints):
    engine = _engine(tiny_checkpoints["llama"])
    prompt = list(range(3, 35))  # exactly 2 blocks
    greedy = SamplingParams(temperature=0, max_tokens=3)
    first, _ = _prefill_tokens(engine, "a", prompt, greedy)
    again, computed = _prefill_tokens(engine, "b", prompt, greedy)
    assert again.num_cached_tokens == 16 and computed == 16  # last block recomputed for logits
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_n4_samples_share_prompt_blocks_and_match_independent_runs(tiny_checkpoints):
    path = tiny_checkpoints["qwen2"]
    engine = _engine(path)
    prompt = list(range(3, 43))  # 40 tokens: 2 full blocks and a partial one
    params = SamplingParams(n=4, temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    engine.add_request("fork", prompt, params)
    engine.step()  # the whole prompt in one step, then the fork
    seqs = engine._requests["fork"].seqs
    assert len(seqs) == 4
    table = seqs[0].block_table
    assert len(table) == 3 and all(s.block_table == table for s in seqs)
    assert [engine.kv.blocks[b].ref_count for b in table] == [4, 4, 4]
    assert engine.get_stats().num_used_blocks == 3
    engine.step()  # first decode: each sample writes into the shared partial block
    assert [engine.kv.blocks[b].ref_count for b in table[:2]] == [4, 4]
    assert len({s.block_table[2] for s in seqs}) == 4
    assert engine.get_stats().cow_copies == 3  # the last writer keeps the original
    final = None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.finished), final)
    samples = [o.token_ids for o in final.outputs]
    assert len(set(map(tuple, samples))) > 1, "seeded samples should differ from each other"

    for i in range(4):
        single = _engine(path)
        one = SamplingParams(n=1, temperature=1.0, seed=1234 + i, max_tokens=12, ignore_eos=True)
        out, _ = _prefill_tokens(single, f"s{i}", prompt, one)
        assert out.outputs[0].token_ids == samples[i]


@pytest.mark.parametrize("block_size", [1, 16])
def test_n_greedy_forks_agree(tiny_checkpoints, block_size):
    engine = _engine(tiny_checkpoints["mistral"], block_size=block_size, num_gpu_blocks_override=512)
    out, _ = _prefill_tokens(engine, "g", list(range(5, 30)),
                             SamplingParams(n=3, temperature=0, max_tokens=10, ignore_eos=True))
    assert len({tuple(o.token_ids) for o in out.outputs}) == 1
