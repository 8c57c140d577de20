"""Suffix decoding end to end: greedy output equals transformers' own generate (the oracle,
what the engine gives with speculation off) on every family and paged-cache variant, in a
first round drafting from the requests' own tokens and a second drafting from the first
round's outputs; n = 2 samples; seeded sampling token for token the same as without."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from test_spec_decode import MAX_NEW, VARIANTS, _prompts, _record_steps, references  # noqa: F401
from test_spec_decode_sampling import _PROMPTS, _sampled_params

SUFFIX = {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 12}


def _accepted(llm: LLM) -> tuple[int, int]:
    stats = llm.llm_engine.get_stats()
    return stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_with_suffix_drafts_matches_transformers(family, variant, tiny_checkpoints,
                                                        references):  # noqa: F811
    kwargs = dict(num_gpu_blocks_override=512, max_model_len=256, dtype="float32",
                  speculative_config=SUFFIX)
    kwargs.update(VARIANTS[variant])
    llm = LLM(model=tiny_checkpoints[family], **kwargs)
    shapes = _record_steps(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    first = llm.generate(_prompts(), params)
    assert [o.outputs[0].token_ids for o in first] == references[family]
    drafted, accepted = _accepted(llm)
    assert accepted > 0 and drafted > accepted
    proposer = llm.llm_engine.scheduler.proposer
    proposer.cache.flush()
    assert proposer.cache.trees[None].root.count == sum(len(r) for r in references[family])
    again = llm.generate(_prompts(), params)  # the same prompts: the tree knows the answers
    assert [o.outputs[0].token_ids for o in again] == references[family]
    drafted2, accepted2 = (a - b for a, b in zip(_accepted(llm), (drafted, accepted)))
    assert accepted2 / drafted2 > accepted / drafted and accepted2 > accepted
    assert any(spec and plain for spec, plain, _ in shapes), "rows with and without drafts"
    if variant == "preempt":
        assert llm.llm_engine.get_stats().num_preemptions > 0


def test_n_samples_keep_greedy_parity_with_suffix_drafts(tiny_checkpoints,
                                                         references):  # noqa: F811
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=256, max_model_len=256,
              dtype="float32", block_size=8, speculative_config=SUFFIX)
    _record_steps(llm)
    prompts = _prompts()[:6]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, n=2)
    for _ in range(2):
        outputs = llm.generate(prompts, params)
        for i, out in enumerate(outputs):
            assert [c.token_ids for c in out.outputs] == [references["llama"][i]] * 2
    assert _accepted(llm)[1] > 0 and llm.llm_engine.get_stats().cow_copies > 0


def test_seeded_sampling_is_token_for_token_the_same_with_suffix_drafts(tiny_checkpoints):
    path = tiny_checkpoints["mistral"]
    prompts = [_PROMPTS[i % len(_PROMPTS)] for i in range(6)]
    runs = []
    for spec in (None, SUFFIX):
        llm = LLM(model=path, num_gpu_blocks_override=256, max_model_len=256, dtype="float32",
                  block_size=4, speculative_config=spec)
        runs.append([llm.generate(prompts, _sampled_params()) for _ in range(2)])
    seeded = [i for i, p in enumerate(_sampled_params()) if p.seed is not None]
    assert _accepted(llm)[1] >= 10
    for plain, spec_out in zip(*runs):
        for i in seeded:
            assert [c.token_ids for c in spec_out[i].outputs] == \
                [c.token_ids for c in plain[i].outputs], i
