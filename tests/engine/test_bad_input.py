"""Bad settings and requests raise ValueErrors that name what to change, and lose nothing."""
from __future__ import annotations

import pytest

from engine import LLM, EngineConfig, SamplingParams


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=0), "n must"),
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-5), "top_k"),
    (dict(min_p=2.0), "min_p"),
    (dict(logprobs=50), "logprobs"),
    (dict(min_tokens=5, max_tokens=2), "min_tokens"),
    (dict(stop=[""]), "stop"),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(min_p=float("nan")), "min_p"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(frequency_penalty=float("-inf")), "frequency_penalty"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(temperature="1"), "temperature"),
    (dict(top_k=5.0), "top_k"),
    (dict(top_k="5"), "top_k"),
    (dict(n=True), "n must be an integer"),
    (dict(max_tokens=2.0), "max_tokens"),
    (dict(min_tokens=None), "min_tokens"),
    (dict(logprobs=True), "logprobs"),
    (dict(seed=1.5), "seed"),
    (dict(seed=2**64), "seed"),
    (dict(seed=-2**63 - 1), "seed"),
    (dict(n=2, seed=2**64 - 1), r"seed \+ n - 1"),
    (dict(stop_token_ids=[-100000]), "stop_token_ids"),
    (dict(stop_token_ids=["7"]), "stop_token_ids"),
])
def test_sampling_params_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_size=12), "block_size must be a power of two"),
    (dict(block_size=512), "block_size"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=1.2), "gpu_memory_utilization"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(scheduling_policy="lifo"), "scheduling_policy"),
    (dict(cpu_threads=0), "cpu_threads must be a whole number >= 1"),
    (dict(cpu_threads=1.5), "cpu_threads"),
])
def test_engine_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_bad_cpu_threads_env_names_the_variable(monkeypatch):
    monkeypatch.setenv("PAGED_CPU_THREADS", "two")
    with pytest.raises(ValueError, match="PAGED_CPU_THREADS must be a whole number >= 1 "
                                         r"\(or unset\), got 'two'"):
        EngineConfig()
    monkeypatch.setenv("PAGED_CPU_THREADS", "3")
    assert EngineConfig().cpu_threads == 3


def test_incomplete_model_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"missing weights .* tokenizer"):
        LLM(model=str(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        LLM(model=str(tmp_path / "nope"))


def test_pool_too_small_says_how_many_blocks(tiny_checkpoints):
    with pytest.raises(ValueError, match="needs 16"):
        LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=4, max_model_len=256)


def test_memory_fraction_too_small(tiny_checkpoints):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(model=tiny_checkpoints["llama"], gpu_memory_utilization=0.0001, cpu_memory_gib=0.01)


def test_bad_requests_are_rejected_and_the_engine_keeps_serving(tiny_checkpoints):
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=64, max_model_len=64)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": list(range(3, 100))}, greedy)
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []}, greedy)
    for bad in ([1, 10**9], [1, -1], [-5], [1, 2.0], [2.0], [True, 2], [True], [3, "4"]):
        with pytest.raises(ValueError, match="prompt_token_ids must be integers"):
            llm.generate({"prompt_token_ids": bad}, greedy)
    with pytest.raises(ValueError, match="one SamplingParams or one per prompt"):
        llm.generate(["a", "b"], [greedy])
    # a bad prompt in the middle of a batch aborts the whole call and frees its blocks
    with pytest.raises(ValueError):
        llm.generate(["fine", {"prompt_token_ids": []}], greedy)
    assert not llm.llm_engine.has_unfinished_requests()
    out = llm.generate(["still serving"], greedy)
    assert len(out[0].outputs[0].token_ids) == 4


def test_generation_stops_at_max_model_len(tiny_checkpoints):
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=64, max_model_len=40)
    out = llm.generate({"prompt_token_ids": list(range(3, 33))},
                       SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 10
    assert out[0].outputs[0].finish_reason == "length"


def test_extreme_but_valid_sampling_values_are_accepted():
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1  # torch's manual_seed takes it
    assert SamplingParams(seed=-2**63, n=3).seed == -2**63
    assert SamplingParams(top_k=9223372036854775808).top_k == 9223372036854775808
    assert SamplingParams(temperature=1e-9).temperature == 1e-2  # vLLM's floor: 1/T overflows


def test_issue_11_requests_are_rejected_or_served_and_the_engine_keeps_serving(tiny_checkpoints):
    """The single requests that once killed the engine for good."""
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=64, max_model_len=64)
    vocab = llm.llm_engine.info.vocab_size
    for ids in ([100000000], [vocab], [-100000]):
        with pytest.raises(ValueError, match="stop_token_ids"):
            llm.generate("hi", SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=ids))
    served = llm.generate(["hi"] * 4, [
        SamplingParams(max_tokens=3, temperature=1, top_k=9223372036854775808),
        SamplingParams(max_tokens=3, temperature=1, seed=2**64 - 1),
        SamplingParams(max_tokens=3, temperature=1, seed=-2**63, n=2),
        SamplingParams(max_tokens=3, min_tokens=2, stop_token_ids=[vocab - 1], top_p=0.5)])
    assert [len(o.outputs) for o in served] == [1, 1, 2, 1]
    assert all(1 <= len(c.token_ids) <= 3 for o in served for c in o.outputs)
    assert not llm.llm_engine.has_unfinished_requests()
