"""A step that raises fails only the request responsible; the engine goes on serving.

Faults are injected for one request id in a batch of several, in each stage of a step:
model execution, sampling, output processing. The other requests' tokens must equal a clean
run, the culprit must come out once, finished, with `error` set, and no block may leak.
"""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampler import Sampler

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
TWO = SamplingParams(n=2, temperature=0.9, seed=3, top_p=0.9, max_tokens=6, ignore_eos=True)
REQUESTS = {
    "a": ([5, 17, 42, 99, 7, 3, 250, 12], GREEDY),
    "b": ([8, 8, 9, 10, 11], SEEDED),
    "c": (list(range(20, 60)), TWO),  # a prompt longer than one block, forks into 2
}
BAD = ("bad", [30, 31, 32, 33], SamplingParams(n=2, temperature=0.7, max_tokens=8, ignore_eos=True))


@pytest.fixture(scope="module")
def llm(tiny_checkpoints):
    return LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=64, max_model_len=128,
               block_size=16)


def _run(engine, requests):
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    finals: dict[str, list] = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                finals.setdefault(out.request_id, []).append(out)
    assert not engine.has_unfinished_requests()
    assert all(len(v) == 1 for v in finals.values()), "a request finished twice"
    return {rid: v[0] for rid, v in finals.items()}


def _tokens(out):
    return [o.token_ids for o in out.outputs]


@pytest.fixture(scope="module")
def clean(llm):
    return {rid: _tokens(out) for rid, out in _run(llm.llm_engine, REQUESTS).items()}


def _check(llm, clean, outs, culprit_tokens_at_most):
    engine = llm.llm_engine
    for rid in REQUESTS:
        assert outs[rid].error is None
        assert _tokens(outs[rid]) == clean[rid], rid
    bad = outs["bad"]
    assert bad.finished and bad.error and "injected" in bad.error
    assert all(o.finish_reason == "error" for o in bad.outputs)
    assert all(len(o.token_ids) <= culprit_tokens_at_most for o in bad.outputs)
    engine.check_no_leaks()
    assert engine.get_stats().num_used_blocks == 0
    after = llm.generate({"prompt_token_ids": REQUESTS["a"][0]}, GREEDY)  # still serving
    assert _tokens(after[0]) == clean["a"]


def _with_bad(requests):
    return {**requests, BAD[0]: (BAD[1], BAD[2])}


def _scramble_free_blocks(engine):
    """Garbage in never-cached blocks, so a copy-on-write copy that the retry forgot shows."""
    free = torch.tensor(engine.kv._free, dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    for key, value in engine.runner.kv_caches:
        for cache in (key, value):
            cache[free] = torch.randn(cache[free].shape, generator=gen).to(cache.dtype) * 100


def test_model_fault_fails_only_its_request(llm, clean, monkeypatch):
    runner = llm.llm_engine.runner
    original = runner.execute
    calls = {"bad": 0}

    def execute(batch):
        if any(s.request_id == "bad" for s in batch.seqs):
            calls["bad"] += 1
            if calls["bad"] >= 2:  # the first decode: forks exist, "c" copies on write
                assert batch.blocks_to_copy or calls["bad"] > 2
                raise RuntimeError("injected model fault")
        return original(batch)

    monkeypatch.setattr(runner, "execute", execute)
    _scramble_free_blocks(llm.llm_engine)
    outs = _run(llm.llm_engine, _with_bad(REQUESTS))
    _check(llm, clean, outs, culprit_tokens_at_most=1)


def test_sampler_fault_after_drawing_keeps_seeded_streams(llm, clean, monkeypatch):
    original = Sampler.__call__

    def call(self, logits, seqs):
        result = original(self, logits, seqs)  # seeded generators have advanced: restored
        if any(s.request_id == "bad" for s in seqs):
            raise ValueError("injected sampler fault")
        return result

    monkeypatch.setattr(Sampler, "__call__", call)
    outs = _run(llm.llm_engine, _with_bad(REQUESTS))
    _check(llm, clean, outs, culprit_tokens_at_most=0)  # fails at its first sample, pre-fork


def test_output_processing_fault_fails_only_its_request(llm, clean, monkeypatch):
    processor = llm.llm_engine.output
    original = processor.append_token

    def append_token(req, seq, token, *args):
        if req.request_id == "bad" and seq.num_output_tokens == 4 and seq.index == 1:
            raise KeyError("injected detokenizer fault")
        return original(req, seq, token, *args)

    monkeypatch.setattr(processor, "append_token", append_token)
    outs = _run(llm.llm_engine, _with_bad(REQUESTS))
    _check(llm, clean, outs, culprit_tokens_at_most=5)
    assert any(len(o.token_ids) >= 4 for o in outs["bad"].outputs)  # it had produced tokens


def test_every_request_failing_alone_fails_each_and_the_engine_survives(llm, monkeypatch):
    runner = llm.llm_engine.runner
    original = runner.execute

    def execute(batch):
        if any(s.request_id.startswith("x") for s in batch.seqs):
            raise RuntimeError("injected: every request")
        return original(batch)

    monkeypatch.setattr(runner, "execute", execute)
    outs = _run(llm.llm_engine, {f"x{i}": ([3 + i, 4, 5], GREEDY) for i in range(3)})
    assert sorted(outs) == ["x0", "x1", "x2"] and all(o.error for o in outs.values())
    assert llm.llm_engine.get_stats().num_used_blocks == 0


def test_device_fault_still_raises(llm, monkeypatch):
    engine = llm.llm_engine

    def execute(batch):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(engine.runner, "execute", execute)
    engine.add_request("dev", [5, 6, 7], GREEDY)
    with pytest.raises(RuntimeError, match="CUDA error"):
        engine.step()
    engine.abort_request("dev")
    assert engine.get_stats().num_used_blocks == 0
