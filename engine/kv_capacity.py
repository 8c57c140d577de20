"""How many KV blocks fit in memory: the arithmetic the engine sizes its pool with.

The model runner (engine/model_runner.py) sizes the pool at start-up with these functions,
after loading the weights and profiling one forward; the tuner Job (tuner/incluster/
space_bounds.py) uses the same ones before any engine starts, from the checkpoint's
config and the target's resources, to leave out of its search the settings whose pool
could not start. Torch-free on purpose: the tuner imports it without loading a model.

    budget     = gpu_memory_utilization x device memory - weights - activations
    num_blocks = budget // (block_size x kv bytes per token)
    kv bytes per token = 2 (key and value) x layers x KV heads x head dim x dtype bytes
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def dtype_name(requested: str, config_dtype: Any, device_type: str) -> str:
    """The dtype the engine runs a model in (`--dtype`): a named one as is; `auto` is
    float32 on CPU (half-precision matmuls there are slow and inexact), else the
    checkpoint's float16/bfloat16, else bfloat16. `config_dtype`: the config's `dtype` /
    `torch_dtype`, a string or a torch.dtype (read by its name)."""
    if requested != "auto":
        return requested
    if device_type == "cpu":
        return "float32"
    name = str(config_dtype or "").removeprefix("torch.")
    name = "float16" if name == "half" else name
    return name if name in ("float16", "bfloat16") else "bfloat16"


@dataclass(frozen=True)
class KVShape:
    """The KV cache's shape per token, from a (text) model config."""
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, text_config: Any) -> "KVShape":
        """`text_config`: a transformers config, or a config.json's dict (its text part)."""
        get = text_config.get if isinstance(text_config, dict) else \
            (lambda key, default=None: getattr(text_config, key, default))
        heads = get("num_attention_heads")
        return cls(num_layers=get("num_hidden_layers"),
                   num_kv_heads=get("num_key_value_heads") or heads,
                   head_dim=get("head_dim") or get("hidden_size") // heads)

    def bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def bytes_per_block(self, block_size: int, dtype_bytes: int) -> int:
        return block_size * self.bytes_per_token(dtype_bytes)


def num_kv_blocks(*, device_bytes: float, fraction: float, weight_bytes: float,
                  activation_bytes: float, block_bytes: int) -> int:
    """The pool's blocks (below 1: nothing left for the KV cache)."""
    return int((fraction * device_bytes - weight_bytes - activation_bytes) // block_bytes)


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks one sequence of `num_tokens` tokens holds."""
    return -(-num_tokens // block_size)
