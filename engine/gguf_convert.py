"""Convert a GGUF checkpoint into a standard Hugging Face checkpoint directory.

transformers' GGUF loader (it needs the `gguf` and `accelerate` packages) dequantizes the
file into a float32 model, but `save_pretrained` refuses a model that carries a GGUF
`quantization_config`. So the weights are copied into a fresh model built from the same
config without it, and that model is saved: safetensors, tokenizer with its chat template,
and a generation config with the EOS ids.
"""
from __future__ import annotations

import json
from pathlib import Path


def _require(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ValueError(f"converting a GGUF model needs the {module!r} package; install the "
                         "models extra: pip install 'paged-inference[models]' "
                         "(or: pip install gguf accelerate)")


def convert_gguf_checkpoint(gguf_file: Path, out: Path) -> Path:
    """Write `gguf_file`'s model, dequantized to float32, to `out` in Hugging Face format."""
    for module in ("gguf", "accelerate"):
        _require(module)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    where, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(where, gguf_file=name)
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # assign=True adopts the loaded tensors (no second 0.5 GB copy); tied weights re-tie
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.eval()
    del loaded

    eos = _eos_ids(config, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos if len(eos) > 1 else eos[0],
        pad_token_id=config.pad_token_id if config.pad_token_id is not None else eos[0],
        do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out / "tokenizer_config.json", config.max_position_embeddings)
    return out


def _portable_tokenizer_config(path: Path, max_len: int) -> None:
    """Name a tokenizer class every transformers release knows (5.x writes its own
    `TokenizersBackend`, which 4.x, and so vLLM today, cannot load) and a real length."""
    settings = json.loads(path.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings["model_max_length"] = max_len
    path.write_text(json.dumps(settings, indent=2) + "\n")


def _eos_ids(config, tokenizer) -> list[int]:
    """The config's EOS ids plus the tokenizer's end-of-turn token (one list, in order)."""
    raw = config.eos_token_id
    ids = [raw] if isinstance(raw, int) else list(raw or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the GGUF file names no EOS token; cannot build a generation config")
    return ids
