"""The in-cluster tuning's default space bounded by the target's resources
(tuner/incluster/space_bounds.py): expected bounds are worked out here from the engine's
pool formula and the checkpoint's config, not read from the implementation."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from paged_api.contract import parse_tuning
from tuner.incluster.model_facts import model_facts
from tuner.incluster.space_bounds import job_space, target_memory
from paged_api.search_space import Param

GIB = 2**30
BASE = {"targetRef": {"name": "svc"}}
MAX_LEN = 256


@pytest.fixture(scope="module")
def llama(tiny_checkpoints) -> dict:
    """The tiny llama's facts, read independently: torch's parameter count and the
    config's KV shape (float32 on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoints["llama"]
    config = json.loads((Path(path) / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    return {"path": path, "weights": params * 4, "kv": kv_per_token}


def target(path: str, *, cpu_gib: float | None = None, memory: str | None = None,
           **engine) -> dict:
    spec = {"model": {"uri": path}, "resources": {"gpus": 0},
            "engine": {"maxModelLen": MAX_LEN, **engine}}
    if memory:
        spec["resources"]["memory"] = memory
    if cpu_gib is not None:
        spec["env"] = [{"name": "PAGED_CPU_MEMORY_GIB", "value": repr(cpu_gib)}]
    return {"metadata": {"name": "svc"}, "spec": spec}


def space_for(spec: dict, tgt: dict):
    spec = {**BASE, **spec}
    return job_space(parse_tuning(spec), spec, tgt)


def by_name(space) -> dict[str, Param]:
    return {p.name: p for p in space}


def expected(llama: dict, device: float, top: float) -> dict:
    """The bounds from the formula: the smallest fraction holding the weights and one
    MAX_LEN sequence (every table block size divides MAX_LEN), on the 0.05 grid from 0.5;
    the pool's blocks at `top` and block size 8 (the most), and its tokens."""
    need = llama["weights"] + MAX_LEN * llama["kv"]
    low = 0.5 + math.ceil((need / device - 0.5) / 0.05 - 1e-9) * 0.05
    blocks = {b: int((top * device - llama["weights"]) // (b * llama["kv"]))
              for b in (8, 16, 32, 64, 128)}
    return {"low": round(max(low, 0.5), 10), "seqs": blocks[8],
            "tokens": max(n * b for b, n in blocks.items())}


def test_a_small_target_narrows_the_default_space_to_what_it_can_start(llama) -> None:
    # device memory such that the weights and one sequence need 83 % of it
    device = (llama["weights"] + MAX_LEN * llama["kv"]) / 0.83
    tuning, status = space_for({}, target(llama["path"], cpu_gib=device / GIB))
    want = expected(llama, device, top=0.95)
    assert want["low"] == pytest.approx(0.85) and want["seqs"] < 64 and want["tokens"] < 8192
    space = by_name(tuning.space)
    assert (space["gpu_memory_utilization"].low, space["gpu_memory_utilization"].high) == (
        pytest.approx(want["low"]), 0.95)
    assert space["gpu_memory_utilization"].step == 0.05
    assert (space["max_num_seqs"].low, space["max_num_seqs"].high) == (1, want["seqs"])
    assert (space["max_num_batched_tokens"].low, space["max_num_batched_tokens"].high) == (
        min(256, want["tokens"]), want["tokens"])
    assert space["block_size"].choices == (8, 16, 32, 64, 128)
    # status.searchSpace is the space searched, in spec.searchSpace's grammar
    assert status["searchSpace"]["maxNumSeqs"] == {"min": 1, "max": want["seqs"], "log": True}
    assert status["searchSpace"]["gpuMemoryUtilization"]["min"] == pytest.approx(want["low"])
    notes = " ".join(status["searchSpaceNotes"])
    assert "gpu_memory_utilization 0.5..0.95 -> 0.85..0.95" in notes
    assert f"max_num_seqs 1..64 -> 1..{want['seqs']}" in notes


def test_a_memory_limit_caps_the_fraction_on_cpu(llama) -> None:
    device = (llama["weights"] + MAX_LEN * llama["kv"]) / 0.78
    limit = int(device * 0.87)     # holds 0.87 of the engine's CPU memory: 0.85 on the grid
    tuning, status = space_for({}, target(llama["path"], cpu_gib=device / GIB,
                                          memory=str(limit)))
    want = expected(llama, device, top=0.85)
    space = by_name(tuning.space)
    assert space["gpu_memory_utilization"].high == pytest.approx(0.85)
    assert space["max_num_seqs"].high == want["seqs"]
    assert space["max_num_batched_tokens"].high == want["tokens"]
    assert "spec.resources.memory" in " ".join(status["searchSpaceNotes"])


def test_block_sizes_no_fraction_can_start_with_are_dropped(llama) -> None:
    # maxModelLen 200: block size b holds ceil(200 / b) * b tokens; 128 takes 256
    device = (llama["weights"] + 200 * llama["kv"]) / 0.93
    tuning, _ = space_for({}, target(llama["path"], cpu_gib=device / GIB, maxModelLen=200))
    kept = [b for b in (8, 16, 32, 64, 128)
            if llama["weights"] + math.ceil(200 / b) * b * llama["kv"] <= 0.95 * device]
    assert kept != [8, 16, 32, 64, 128]
    assert by_name(tuning.space)["block_size"].choices == tuple(kept)


def test_a_large_target_keeps_the_tables_ranges(llama) -> None:
    tuning, status = space_for({}, target(llama["path"], memory="8Gi"))   # 2 GiB default
    assert tuning.space == parse_tuning(BASE).space
    assert status["searchSpaceNotes"][-1] == "the settings table's ranges fit"


@pytest.mark.parametrize("memory, cpu_gib, fix", [
    (None, "tiny", "raise the engine's CPU memory (spec.env PAGED_CPU_MEMORY_GIB)"),
    ("small", None, "raise spec.resources.memory above"),   # the operator's derivation
    ("between", "two", "set spec.env PAGED_CPU_MEMORY_GIB to at most spec.resources.memory"),
])
def test_a_target_that_fits_at_no_fraction_fails_naming_what_to_change(llama, memory,
                                                                      cpu_gib, fix) -> None:
    need = llama["weights"] + MAX_LEN * llama["kv"]
    sizes = {"tiny": need / 0.96 / GIB, "small": f"{int(need * 0.9)}", "two": 2.0,
             "between": f"{int(need * 1.2)}"}   # fits, but 0.5 x 2 GiB is above the limit
    tgt = target(llama["path"], cpu_gib=sizes.get(cpu_gib), memory=sizes.get(memory))
    with pytest.raises(ValueError) as info:
        space_for({}, tgt)
    assert str(info.value).startswith("spec.targetRef: svc cannot hold")
    assert fix in str(info.value) and "lower spec.engine.maxModelLen" in str(info.value)


def test_a_given_search_space_is_searched_as_given_with_notes(llama) -> None:
    device = (llama["weights"] + MAX_LEN * llama["kv"]) / 0.83
    given = {"searchSpace": {"gpuMemoryUtilization": [0.5, 0.9], "maxNumSeqs": [8, 512]}}
    tuning, status = space_for(given, target(llama["path"], cpu_gib=device / GIB))
    assert tuning.space == parse_tuning({**BASE, **given}).space
    notes = [n for n in status["searchSpaceNotes"] if "searched as given" in n]
    assert any("gpu_memory_utilization 0.5,0.9 -> 0.9" in n for n in notes)
    assert any("max_num_seqs 8,512 -> 8" in n for n in notes)
    # values that can start but cannot matter (more sequences than blocks) do not fail it
    given = {"searchSpace": {"maxNumSeqs": [512]}}
    tuning, status = space_for(given, target(llama["path"], cpu_gib=device / GIB))
    assert tuning.space == (Param("max_num_seqs", choices=(512,)),)
    assert any("max_num_seqs 512 -> none: the pool holds" in n
               for n in status["searchSpaceNotes"])


@pytest.mark.parametrize("spec, words", [
    ({"model": {"uri": "pvc://models/llama"}, "resources": {"gpus": 0}},
     "on a claim (pvc://models/llama)"),
    ({"model": {"uri": "builtin://default"}, "resources": {"gpus": 2}},
     "runs on 2 GPU(s), whose memory its spec does not say"),
    ({"model": {"uri": "/no/such/dir"}, "resources": {"gpus": 0}}, "not a directory"),
    ({"model": {"uri": "hf://org/model"}, "resources": {"gpus": 0}},
     "org/model is on the Hugging Face hub and the Job's pod is offline"),
])
def test_what_the_job_cannot_know_keeps_the_tables_ranges_and_says_why(spec, words,
                                                                       monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tuning, status = space_for({}, {"spec": spec})
    assert tuning.space == parse_tuning(BASE).space
    assert words in status["searchSpaceNotes"][0]
    assert status["searchSpaceNotes"][0].startswith("the settings table's ranges, not bounded")


def test_the_checkpoint_facts_match_what_the_engine_computes(llama) -> None:
    """The Job's reading of a checkpoint (safetensors headers, config) agrees with the
    engine's loaded model: weights and KV bytes per block."""
    from engine import LLM

    facts = model_facts(llama["path"])
    assert facts.parameters * 4 == llama["weights"]
    llm = LLM(model=llama["path"], num_gpu_blocks_override=64, max_model_len=MAX_LEN,
              device="cpu", block_size=16)
    runner = llm.llm_engine.runner
    assert runner.weight_bytes() == facts.parameters * 4
    assert llm.llm_engine.info.kv_bytes_per_block == facts.kv_shape.bytes_per_block(16, 4)


def test_a_dropped_fraction_is_one_the_engine_refuses_to_start_with(llama) -> None:
    """The value just below the raised low end cannot start: the engine says so."""
    from engine import LLM

    device = (llama["weights"] + MAX_LEN * llama["kv"]) / 0.83
    tuning, _ = space_for({}, target(llama["path"], cpu_gib=device / GIB))
    below = round(by_name(tuning.space)["gpu_memory_utilization"].low - 0.05, 10)
    with pytest.raises(ValueError, match="gpu_memory_utilization|max_model_len"):
        LLM(model=llama["path"], gpu_memory_utilization=below, cpu_memory_gib=device / GIB,
            max_model_len=MAX_LEN, block_size=8, device="cpu")


@pytest.mark.parametrize("spec, gib, where", [
    ({"env": [{"name": "PAGED_CPU_MEMORY_GIB", "value": "3"}]}, 3, "spec.env"),
    ({"engine": {"extraArgs": ["--cpu-memory-gib=5"]},
      "env": [{"name": "PAGED_CPU_MEMORY_GIB", "value": "3"}]}, 5, "extraArgs"),
    ({"engine": {"extraArgs": ["--cpu-memory-gib", "0.5"]}}, 0.5, "extraArgs"),
    ({}, 0.25, "spec.resources.memory less the engine's runtime"),   # as the operator sets
])
def test_the_engines_cpu_memory_is_read_as_the_engine_reads_it(spec, gib, where) -> None:
    memory = target_memory({"resources": {"gpus": 0, "memory": "1Gi"}, **spec})
    assert memory.device_bytes == gib * GIB and memory.limit_bytes == GIB
    assert where in memory.device_label


def test_without_a_memory_limit_the_engines_default_is_its_cpu_memory() -> None:
    memory = target_memory({"resources": {"gpus": 0}})
    assert memory.device_bytes == 2 * GIB and memory.limit_bytes is None
    assert "the engine's default" in memory.device_label


def test_the_memory_to_ask_for_gives_the_engine_what_it_needs() -> None:
    from paged_api.kv_cache import cpu_device_gib, memory_for_cpu_device
    for gib in (0.05, 0.25, 0.3, 1.0, 6.5):
        asked = memory_for_cpu_device(gib)
        assert cpu_device_gib(f"{asked * 1024:.0f}Mi") == pytest.approx(gib, abs=1e-3)
        assert cpu_device_gib(f"{(asked - 0.01) * 1024:.0f}Mi") < gib


def test_a_bad_cpu_memory_names_where_it_is_set() -> None:
    with pytest.raises(ValueError, match="^spec.env PAGED_CPU_MEMORY_GIB must be a number"):
        target_memory({"resources": {"gpus": 0},
                       "env": [{"name": "PAGED_CPU_MEMORY_GIB", "value": "lots"}]})


def test_a_hub_model_is_read_from_its_config_and_safetensors_metadata(tmp_path,
                                                                      monkeypatch) -> None:
    """No weights are fetched: config.json and the parameter counts per dtype."""
    import huggingface_hub
    from types import SimpleNamespace

    from tuner.incluster.model_facts import Unknown

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"text_config": {
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "hidden_size": 2048, "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16"}}))
    asked = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo, name: asked.append((repo, name)) or str(config))
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", lambda repo:
                        SimpleNamespace(parameter_count={"BF16": 1_000_000, "F32": 24}))
    facts = model_facts("hf://org/model")
    assert asked == [("org/model", "config.json")]
    assert facts.parameters == 1_000_024 and facts.config_dtype == "bfloat16"
    assert facts.kv_shape.bytes_per_token(2) == 2 * 28 * 8 * 128 * 2
    assert facts.max_position_embeddings == 40960

    def refused(repo):
        raise OSError("401 Unauthorized")
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", refused)
    facts = model_facts("org/model")
    assert isinstance(facts, Unknown) and "401 Unauthorized" in facts.why
