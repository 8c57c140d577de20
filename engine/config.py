"""Engine settings (frozen, validated once) and the runtime facts derived from them."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from paged_api import settings
from paged_api.settings import env_default

DEFAULT_CPU_MEMORY_GIB: float = settings.SETTINGS["cpu_memory_gib"].default


def _d(name: str):
    """The table's default (api/paged_api/settings.py), so it is written in one place."""
    return settings.SETTINGS[name].default


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """User settings, under vLLM's names. Derived facts live in `RuntimeInfo`."""

    model: str | None = _d("model")  # None: the embedded default checkpoint
    served_model_name: str | None = _d("served_model_name")
    block_size: int = _d("block_size")
    gpu_memory_utilization: float = _d("gpu_memory_utilization")
    max_num_seqs: int = _d("max_num_seqs")
    max_num_batched_tokens: int = _d("max_num_batched_tokens")
    max_model_len: int | None = _d("max_model_len")  # None: max_position_embeddings
    enable_prefix_caching: bool = _d("enable_prefix_caching")
    num_gpu_blocks_override: int | None = _d("num_gpu_blocks_override")
    seed: int = _d("seed")
    dtype: str = _d("dtype")
    scheduling_policy: str = _d("scheduling_policy")  # or "priority" (lower value first)
    device: str = _d("device")
    # On CPU, `gpu_memory_utilization` is a fraction of this many GiB (the "device memory");
    # env PAGED_CPU_MEMORY_GIB.
    cpu_memory_gib: float = field(default_factory=lambda: env_default("cpu_memory_gib"))
    # On CPU, torch's intra-op threads (None: torch's default, one per core; env
    # PAGED_CPU_THREADS). Fewer than the cores when other busy processes share them:
    # spinning OpenMP workers that lose their core stall each step (see README.md,
    # "CPU threads").
    cpu_threads: int | None = field(default_factory=lambda: env_default("cpu_threads"))
    attention_backend: str | None = _d("attention_backend")  # "torch" | "triton"; None: by device
    disable_log_stats: bool = _d("disable_log_stats")
    # n-gram speculative decoding (vLLM's dict; None: off), checked and completed by the table
    speculative_config: dict | None = _d("speculative_config")
    # KV cache events over ZeroMQ (vLLM's dict; None: off), engine/kv_events.py
    kv_events_config: dict | None = _d("kv_events_config")
    # KV tiers under the device pool (engine/kv_offload/): host memory in GiB, and a disk
    # directory (shared by engines on a node) bounded by kv_disk_size GiB; None: off
    kv_offloading_size: float | None = _d("kv_offloading_size")
    kv_offloading_backend: str = _d("kv_offloading_backend")
    kv_offloading_eviction_policy: str = _d("kv_offloading_eviction_policy")
    kv_disk_dir: str | None = _d("kv_disk_dir")
    kv_disk_size: float | None = _d("kv_disk_size")

    def __post_init__(self) -> None:
        """Each field against its row of the settings table, then the cross-setting rules
        (max_num_batched_tokens >= max_num_seqs, as vLLM's SchedulerConfig checks)."""
        for f in fields(self):
            value = settings.check(f.name, getattr(self, f.name))
            object.__setattr__(self, f.name, value)  # an int given for a float becomes one
        settings.check_rules({f.name: getattr(self, f.name) for f in fields(self)})


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
