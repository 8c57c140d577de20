"""Engine settings (frozen, validated once) and the runtime facts derived from them."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

DEFAULT_CPU_MEMORY_GIB = 2.0


def _env_cpu_memory_gib() -> float:
    raw = os.environ.get("PAGED_CPU_MEMORY_GIB")
    if raw is None:
        return DEFAULT_CPU_MEMORY_GIB
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"PAGED_CPU_MEMORY_GIB={raw!r} is not a number of GiB") from None


def _env_cpu_threads() -> int | None:
    raw = os.environ.get("PAGED_CPU_THREADS")
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"PAGED_CPU_THREADS={raw!r} is not a whole number of threads") from None


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """User settings, under vLLM's names. Derived facts live in `RuntimeInfo`."""

    model: str | None = None  # None: the embedded default checkpoint
    served_model_name: str | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    seed: int = 0
    dtype: str = "auto"
    scheduling_policy: str = "fcfs"  # or "priority" (lower value first, as in vLLM)
    device: str = "auto"
    # On CPU, `gpu_memory_utilization` is a fraction of this many GiB (the "device memory").
    cpu_memory_gib: float = field(default_factory=_env_cpu_memory_gib)
    # On CPU, torch's intra-op threads (None: torch's default, one per core). Fewer than the
    # cores when other busy processes share them: spinning OpenMP workers that lose their
    # core stall each step (see README.md, "CPU threads").
    cpu_threads: int | None = field(default_factory=_env_cpu_threads)
    attention_backend: str | None = None  # "torch" | "triton"; None: by device
    disable_log_stats: bool = True

    def __post_init__(self) -> None:
        bs = self.block_size
        if not isinstance(bs, int) or bs < 1 or bs > 256 or bs & (bs - 1):
            raise ValueError(f"block_size must be a power of two in 1..256, got {bs!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs!r}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len!r}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(
                f"num_gpu_blocks_override must be >= 1, got {self.num_gpu_blocks_override!r}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16", "half", "float"):
            raise ValueError(
                f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")
        if self.cpu_memory_gib <= 0:
            raise ValueError(f"cpu_memory_gib must be > 0, got {self.cpu_memory_gib!r}")
        if self.cpu_threads is not None and (not isinstance(self.cpu_threads, int)
                                             or self.cpu_threads < 1):
            raise ValueError(f"cpu_threads must be a whole number >= 1 (or None for torch's "
                             f"default), got {self.cpu_threads!r}")


@dataclass(frozen=True)
class RuntimeInfo:
    """Facts the engine learns at start-up (model, memory), kept apart from user settings."""

    model_path: str
    model_name: str
    max_model_len: int
    num_blocks: int
    block_size: int
    eos_token_ids: frozenset[int]
    vocab_size: int
    kv_bytes_per_block: int
    device: str
    dtype: str
    attention_backend: str
