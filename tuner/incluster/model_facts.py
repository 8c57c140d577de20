"""What the tuner Job can learn about the target's model before any trial starts: the KV
cache's shape per token, the parameter count (the weights' bytes at the engine's dtype)
and the longest context, from the checkpoint's config.json and safetensors headers (no
weights are read, no torch is loaded).

Where the Job finds a checkpoint: a built-in model (the engine image ships them;
`builtin://default` is built in the Job's pod in a moment, the others only when already
in its model cache: building one there would take the Job's memory); a directory baked
into the image (spec.model.uri /abs/path, when the Job runs the target's image); a
Hugging Face id through the hub's API (config.json and the safetensors metadata, no
weights), unless the pod is offline. A model on a claim (pvc://) the Job does not mount.
Where none is found, `Unknown` says why and the space keeps the table's ranges.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.kv_capacity import KVShape

SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
                           "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class ModelFacts:
    source: str                      # where they were read, for the notes
    kv_shape: KVShape
    parameters: int                  # weights' elements (tied embeddings counted once)
    config_dtype: str | None         # the checkpoint's dtype (the engine's `auto` reads it)
    max_position_embeddings: int | None


@dataclass(frozen=True)
class Unknown:
    why: str


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's language part (`text_config`), else the config itself."""
    return config.get("text_config") or config


def from_config(config: dict[str, Any], parameters: int, source: str) -> ModelFacts:
    text = text_config(config)
    return ModelFacts(source=source, kv_shape=KVShape.of(text), parameters=parameters,
                      config_dtype=text.get("dtype") or text.get("torch_dtype")
                      or config.get("dtype") or config.get("torch_dtype"),
                      max_position_embeddings=text.get("max_position_embeddings"))


def safetensors_parameters(path: Path) -> int:
    """Elements in one .safetensors file, from its header (an 8-byte little-endian length,
    then JSON: tensor name -> {dtype, shape, data_offsets})."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    count = 0
    for name, tensor in header.items():
        if name != "__metadata__":
            n = 1
            for dim in tensor["shape"]:
                n *= dim
            count += n
    return count


def from_directory(path: Path, source: str) -> ModelFacts | Unknown:
    config_file = path / "config.json"
    if not config_file.is_file():
        return Unknown(f"{source} has no config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return Unknown(f"{source} has no .safetensors weights to count")
    return from_config(json.loads(config_file.read_text()),
                       sum(safetensors_parameters(f) for f in files), source)


def from_hub(repo: str) -> ModelFacts | Unknown:
    """config.json and the safetensors metadata (parameter counts) from the hub's API."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return Unknown(f"the model {repo} is on the Hugging Face hub and the Job's pod is "
                       "offline (HF_HUB_OFFLINE)")
    try:
        from huggingface_hub import get_safetensors_metadata, hf_hub_download

        config = json.loads(Path(hf_hub_download(repo, "config.json")).read_text())
        parameters = sum(get_safetensors_metadata(repo).parameter_count.values())
    except Exception as exc:   # network, auth, no safetensors: the table's ranges
        return Unknown(f"the hub did not give {repo}'s config.json and safetensors "
                       f"metadata ({type(exc).__name__}: {exc})")
    return from_config(config, parameters, f"the hub's {repo}")


def _builtin(uri: str) -> ModelFacts | Unknown:
    from engine import builtin_models

    try:
        entry = builtin_models.lookup(uri)
    except ValueError as exc:
        return Unknown(str(exc))
    path = builtin_models.model_cache_root() / entry.cache_dir_name
    if not builtin_models.is_built(path) and uri != builtin_models.DEFAULT_MODEL:
        return Unknown(f"{uri} is not built in the Job's model cache (the engine builds it "
                       "on first use; the Job does not, to keep its memory)")
    try:
        path = builtin_models.ensure_builtin(uri)
    except (OSError, ValueError) as exc:
        return Unknown(f"{uri} could not be built in the Job's pod: {exc}")
    return from_directory(path, uri)


def model_facts(uri: str | None, *,
                hub: Callable[[str], ModelFacts | Unknown] = from_hub
                ) -> ModelFacts | Unknown:
    """The target's spec.model.uri -> its facts, or why the Job cannot know them."""
    if not uri:
        return Unknown("the target's spec.model.uri is not set")
    if uri.startswith("builtin:"):
        return _builtin(uri)
    if uri.startswith("pvc://"):
        return Unknown(f"the model is on a claim ({uri}), which the Job's pod does not mount")
    if uri.startswith("/"):
        path = Path(uri)
        if not path.is_dir():
            return Unknown(f"{uri} is not a directory in the Job's image (spec.image of the "
                           "tuning differs from the target's?)")
        return from_directory(path, uri)
    return hub(uri.removeprefix("hf://"))
