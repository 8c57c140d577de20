"""Sampling features against transformers' processors and against each other."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_checkpoints):
    return LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=256, max_model_len=256)


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoints):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_checkpoints["llama"], dtype=torch.float32).eval()


PROMPT = {"prompt_token_ids": [5, 17, 42, 99, 7, 3, 250, 12]}


def _ids(out):
    return out[0].outputs[0].token_ids


def test_repetition_penalty_matches_transformers(llm, hf_model):
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.3))
    ids = torch.tensor([PROMPT["prompt_token_ids"]])
    ref = hf_model.generate(ids, max_new_tokens=16, do_sample=False, repetition_penalty=1.3)
    assert _ids(out) == ref[0, ids.shape[1]:].tolist()


def test_logprobs_match_transformers_log_softmax(llm, hf_model):
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4, logprobs=3))
    completion = out[0].outputs[0]
    full = PROMPT["prompt_token_ids"] + completion.token_ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([full])).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    n = len(PROMPT["prompt_token_ids"])
    for step, entry in enumerate(completion.logprobs):
        row = ref[n - 1 + step]
        top = row.topk(3)
        assert set(top.indices.tolist()) <= set(entry)
        for token, lp in entry.items():
            assert lp == pytest.approx(float(row[token]), abs=1e-4)
    assert completion.cumulative_logprob == pytest.approx(
        sum(float(ref[n - 1 + i, t]) for i, t in enumerate(completion.token_ids)), abs=1e-3)


def test_top_k_1_and_tiny_top_p_are_greedy(llm):
    greedy = _ids(llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10)))
    assert _ids(llm.generate(PROMPT, SamplingParams(temperature=1.5, top_k=1, max_tokens=10))) == greedy
    assert _ids(llm.generate(PROMPT, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=10))) == greedy
    assert _ids(llm.generate(PROMPT, SamplingParams(temperature=1.0, min_p=1.0, max_tokens=10))) == greedy


def test_seed_reproducible_regardless_of_batch(llm):
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    alone = _ids(llm.generate(PROMPT, params))
    batch = llm.generate([{"prompt_token_ids": [9, 9, 9]}, PROMPT, "other words here"],
                         [SamplingParams(temperature=1.0, max_tokens=5), params, params])
    assert batch[1].outputs[0].token_ids == alone
    other = _ids(llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=8, max_tokens=12, ignore_eos=True)))
    assert other != alone


def test_stop_token_ids_min_tokens_and_ignore_eos(llm):
    greedy = _ids(llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)))
    target = greedy[3]
    first = greedy.index(target)
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[target]))
    assert out[0].outputs[0].token_ids == greedy[:first + 1]
    assert out[0].outputs[0].finish_reason == "stop" and out[0].outputs[0].stop_reason == target
    banned = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, min_tokens=12,
                                                 stop_token_ids=[target]))
    assert target not in banned[0].outputs[0].token_ids
    assert len(banned[0].outputs[0].token_ids) == 12


def test_stop_strings_truncate_text(llm):
    base = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    text = base.outputs[0].text
    stop = next(text[i:i + 3] for i in range(4, len(text) - 3) if "\ufffd" not in text[i:i + 3])
    cut = text.index(stop)
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]))[0]
    assert out.outputs[0].text == text[:cut]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    kept = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=stop,
                                               include_stop_str_in_output=True))[0]
    assert kept.outputs[0].text == text[:cut + len(stop)]


def test_presence_and_frequency_penalties_reduce_repeats(llm):
    params = dict(temperature=0, max_tokens=40, ignore_eos=True)
    plain = _ids(llm.generate(PROMPT, SamplingParams(**params)))
    penalised = _ids(llm.generate(PROMPT, SamplingParams(frequency_penalty=2.0, presence_penalty=2.0, **params)))
    assert len(set(penalised)) > len(set(plain))


def test_incremental_text_equals_full_decode(llm):
    out = llm.generate(["hello world the model"], SamplingParams(temperature=0.8, seed=3, max_tokens=30,
                                                                ignore_eos=True))[0].outputs[0]
    assert out.text == llm.get_tokenizer().decode(out.token_ids, skip_special_tokens=True)


def test_rows_without_detokenize_carry_the_same_tokens_and_no_text(llm):
    """detokenize=False (vLLM's name) in a batch with rows that detokenize: every row's
    tokens are what it samples alone, the undetokenized rows' text is empty, the others'
    is the decode of their tokens; stop strings need the text, so they are refused."""
    prompts = [PROMPT, {"prompt_token_ids": [9, 8, 7, 6, 5]}, PROMPT]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, detokenize=False),
              SamplingParams(temperature=0.8, seed=5, n=2, max_tokens=10, ignore_eos=True,
                             detokenize=False),
              SamplingParams(temperature=0.8, seed=5, max_tokens=10, ignore_eos=True)]
    mixed = llm.generate(prompts, params)
    alone = [llm.generate(p, dataclasses.replace(q, detokenize=True))[0]
             for p, q in zip(prompts, params)]
    tokenizer = llm.get_tokenizer()
    for out, ref, q in zip(mixed, alone, params):
        assert [o.token_ids for o in out.outputs] == [o.token_ids for o in ref.outputs]
        for o in out.outputs:
            assert o.text == ("" if not q.detokenize else
                              tokenizer.decode(o.token_ids, skip_special_tokens=True))
            assert len(o.token_ids) == q.max_tokens
    assert all(o.text for o in alone[0].outputs)
    with pytest.raises(ValueError, match="detokenize=True to use stop"):
        SamplingParams(stop=["\n"], detokenize=False)


def test_priority_policy_runs_urgent_requests_first(tiny_checkpoints):
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=64, max_model_len=128,
              max_num_seqs=1, scheduling_policy="priority")
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=3)
    for rid, prio in [("low", 5), ("high", 0), ("mid", 2)]:
        engine.add_request(rid, [5, 6, 7], params, priority=prio)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["high", "mid", "low"]


def test_abort_mid_generation_frees_blocks(tiny_checkpoints):
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=64, max_model_len=128)
    engine = llm.llm_engine
    engine.add_request("a", list(range(3, 40)), SamplingParams(n=2, max_tokens=50))
    engine.add_request("b", list(range(3, 20)), SamplingParams(max_tokens=50))
    for _ in range(3):
        engine.step()
    assert engine.get_stats().num_used_blocks > 0
    engine.abort_request("a")
    engine.abort_request("b")
    assert not engine.has_unfinished_requests()
    assert engine.get_stats().num_used_blocks == 0


def test_batched_truncation_mixed_with_plain_rows(llm):
    """Two or more rows with top-p/top-k/min-p in one step (once a crash), next to rows
    that use none: greedy-equivalent settings still give the greedy tokens."""
    greedy = _ids(llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
    same = dict(max_tokens=8, ignore_eos=True)
    outs = llm.generate(["Hello", "Hello", PROMPT, PROMPT, PROMPT, "world"], [
        SamplingParams(temperature=0.8, top_p=0.9, **same),
        SamplingParams(temperature=0.8, top_k=5, min_p=0.05, **same),
        SamplingParams(temperature=1.3, top_k=1, **same),
        SamplingParams(temperature=0, **same),
        SamplingParams(temperature=1.0, top_p=1e-6, min_p=0.5, top_k=9223372036854775807, **same),
        SamplingParams(temperature=1.0, presence_penalty=0.5, seed=1, **same)])
    assert [len(o.outputs[0].token_ids) for o in outs] == [8] * 6
    assert outs[2].outputs[0].token_ids == greedy
    assert outs[3].outputs[0].token_ids == greedy
    assert outs[4].outputs[0].token_ids == greedy
