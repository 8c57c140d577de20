"""Resolve a model argument to a local Hugging Face checkpoint directory and load it."""
from __future__ import annotations

import os
from pathlib import Path

from engine.builtin_models import DEFAULT_MODEL, ensure_builtin, is_builtin, lookup

_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def resolve_model_path(model: str | None) -> Path:
    """None: the embedded default. `builtin://NAME`: a built-in model, built into the model
    cache on first use. A directory: checked as is. Otherwise a hub id, which is downloaded
    into HF_HOME (a production path; tests never reach a hub)."""
    if model is None:
        return ensure_builtin(DEFAULT_MODEL)
    if is_builtin(model):
        path = ensure_builtin(model)
        check_checkpoint_dir(path)
        return path
    path = Path(model).expanduser()
    if path.is_dir():
        check_checkpoint_dir(path)
        return path
    if model.startswith((".", "/", "~")) or os.sep in model.strip("/").split("/", 1)[-1]:
        raise ValueError(f"model directory {model!r} does not exist; pass an existing "
                         "Hugging Face checkpoint directory, a hub id or builtin://NAME")
    try:
        from huggingface_hub import snapshot_download
        local = Path(snapshot_download(model, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as exc:  # network, auth, unknown id: all mean "give a usable model"
        raise ValueError(f"model {model!r} is not a local directory and could not be fetched "
                         f"from the hub ({type(exc).__name__}: {exc}); pass a local checkpoint "
                         "directory with --model / model=") from exc
    check_checkpoint_dir(local)
    return local


def default_served_name(model: str | None, path: Path) -> str:
    """The model id in the API when --served-model-name is not given: a built-in model's
    name (not its cache directory), else the checkpoint directory's name."""
    if is_builtin(model):
        return lookup(model).name
    return path.name


def check_checkpoint_dir(path: Path) -> None:
    missing = []
    if not (path / "config.json").exists():
        missing.append("config.json")
    if not any(next(path.glob(p), None) for p in _WEIGHT_PATTERNS):
        missing.append("weights (*.safetensors)")
    if not any((path / f).exists() for f in _TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json / tokenizer.model)")
    if missing:
        raise ValueError(f"model directory {str(path)!r} is missing {', '.join(missing)}; "
                         "point model= at a complete Hugging Face checkpoint directory")
