"""Launch checks shared by every attention backend.

A bad launch raises ``ValueError`` naming the argument to fix, before any kernel runs: a
Triton kernel handed a slot outside the pool would write into someone else's memory, and
the torch twin would fail later with an indexing error that names nothing useful.

Shape and dtype checks cost nothing. Value checks (slot and block ids inside the pool,
consistent lengths) read the index tensors on the host: one transfer per call, which the
backends let you switch off on CUDA with ``PAGED_ATTENTION_CHECKS=0`` once the engine is
trusted.
"""

from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def _check_tensor(name: str, t: object, *, ndim: int, dtypes: tuple, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} has dtype {str(t.dtype).removeprefix('torch.')}; expected one of: {names}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the KV cache is on {device}; move it to {device}")


def check_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor, *, prefix: str = "") -> tuple[int, int, int, int]:
    """Both caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, same shape/dtype/device."""
    _check_tensor(f"{prefix}key_cache", key_cache, ndim=4, dtypes=FLOAT_DTYPES)
    _check_tensor(f"{prefix}value_cache", value_cache, ndim=4, dtypes=FLOAT_DTYPES, device=key_cache.device)
    if key_cache.shape != value_cache.shape:
        raise ValueError(
            f"{prefix}key_cache shape {tuple(key_cache.shape)} differs from {prefix}value_cache shape "
            f"{tuple(value_cache.shape)}; both are [num_blocks, block_size, num_kv_heads, head_dim]"
        )
    if key_cache.dtype != value_cache.dtype:
        raise ValueError(f"{prefix}key_cache is {key_cache.dtype} but {prefix}value_cache is {value_cache.dtype}")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError(f"{prefix}key_cache/value_cache need a contiguous head_dim (stride 1 in the last dim)")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if min(block_size, num_kv_heads, head_dim) < 1:
        raise ValueError(f"{prefix}key_cache has an empty dimension: shape {tuple(key_cache.shape)}")
    return num_blocks, block_size, num_kv_heads, head_dim


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *, check_values: bool = True) -> None:
    num_blocks, block_size, num_kv_heads, head_dim = check_kv_cache(key_cache, value_cache)
    device = key_cache.device
    for name, t in (("key", key), ("value", value)):
        _check_tensor(name, t, ndim=3, dtypes=(key_cache.dtype,), device=device)
        if tuple(t.shape[1:]) != (num_kv_heads, head_dim):
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; expected [num_tokens, {num_kv_heads}, {head_dim}] "
                f"to match the cache's num_kv_heads and head_dim"
            )
    if key.shape != value.shape:
        raise ValueError(f"key shape {tuple(key.shape)} differs from value shape {tuple(value.shape)}")
    _check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=device)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries but key has {key.shape[0]} tokens")
    if check_values and slot_mapping.numel():
        valid = slot_mapping[slot_mapping >= 0]
        num_slots = num_blocks * block_size
        if valid.numel() and int(valid.max()) >= num_slots:
            raise ValueError(
                f"slot_mapping holds slot {int(valid.max())} but the pool has only {num_slots} slots "
                f"({num_blocks} blocks x {block_size}); negative slots mean 'skip'"
            )
        if valid.numel() != torch.unique(valid).numel():
            raise ValueError("slot_mapping writes the same slot twice; each token needs its own slot")


def check_paged_attention(
    query, key_cache, value_cache, *, cu_seqlens_q, seq_lens, block_tables, scale, sliding_window,
    check_values: bool = True,
) -> None:
    num_blocks, block_size, num_kv_heads, head_dim = check_kv_cache(key_cache, value_cache)
    device = key_cache.device
    _check_tensor("query", query, ndim=3, dtypes=(key_cache.dtype,), device=device)
    num_tokens, num_heads, q_head_dim = query.shape
    if q_head_dim != head_dim:
        raise ValueError(f"query head_dim {q_head_dim} differs from the cache's head_dim {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(
            f"query has {num_heads} heads, not a multiple of the cache's {num_kv_heads} kv heads (GQA needs "
            f"num_heads = group * num_kv_heads)"
        )
    _check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=INDEX_DTYPES, device=device)
    _check_tensor("seq_lens", seq_lens, ndim=1, dtypes=INDEX_DTYPES, device=device)
    _check_tensor("block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES, device=device)
    num_seqs = seq_lens.shape[0]
    if cu_seqlens_q.shape[0] != num_seqs + 1:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries; expected num_seqs + 1 = {num_seqs + 1}")
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows; expected one per sequence ({num_seqs})")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float (usually head_dim ** -0.5), got {scale!r}")
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1
    ):
        raise ValueError(f"sliding_window must be None or a positive int, got {sliding_window!r}")
    if check_values:
        _check_attention_values(num_tokens, num_blocks, block_size, cu_seqlens_q, seq_lens, block_tables)


def _check_attention_values(num_tokens, num_blocks, block_size, cu_seqlens_q, seq_lens, block_tables) -> None:
    # One host transfer of the small index tensors; the block-table check only looks at the
    # entries a sequence's length reaches (the rest is padding and may hold anything).
    cu = cu_seqlens_q.long().cpu()
    lens = seq_lens.long().cpu()
    if int(cu[0]) != 0 or int(cu[-1]) != num_tokens:
        raise ValueError(f"cu_seqlens_q must start at 0 and end at num_tokens={num_tokens}, got {cu.tolist()[:8]}...")
    q_lens = cu[1:] - cu[:-1]
    if bool((q_lens < 0).any()):
        raise ValueError("cu_seqlens_q must be non-decreasing")
    short = (lens < q_lens).nonzero()
    if short.numel():
        i = int(short[0])
        raise ValueError(
            f"seq_lens[{i}]={int(lens[i])} is shorter than that sequence's {int(q_lens[i])} new tokens; "
            f"seq_lens counts the context including the new tokens"
        )
    capacity = block_tables.shape[1] * block_size
    if lens.numel() and int(lens.max()) > capacity:
        raise ValueError(
            f"seq_lens reaches {int(lens.max())} tokens but block_tables has room for {capacity} "
            f"({block_tables.shape[1]} blocks x {block_size})"
        )
    if lens.numel() and block_tables.shape[1]:
        tables = block_tables.long().cpu()
        used = torch.arange(tables.shape[1]) * block_size < lens[:, None]
        bad = used & ((tables < 0) | (tables >= num_blocks))
        if bool(bad.any()):
            i, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"block_tables[{i}, {j}]={int(tables[i, j])} is outside the pool of {num_blocks} blocks"
            )


def check_copy_blocks(key_caches, value_caches, block_mapping, *, check_values: bool = True) -> None:
    if not isinstance(key_caches, (list, tuple)) or not isinstance(value_caches, (list, tuple)):
        raise ValueError("key_caches and value_caches must be lists of per-layer cache tensors")
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches but {len(value_caches)} value caches; one of each per layer")
    if not key_caches:
        raise ValueError("copy_blocks needs at least one layer's caches")
    shape = None
    for layer, (kc, vc) in enumerate(zip(key_caches, value_caches)):
        dims = check_kv_cache(kc, vc, prefix=f"layer {layer} ")
        if shape is not None and dims[0] != shape[0]:
            raise ValueError(f"layer {layer} has {dims[0]} blocks but layer 0 has {shape[0]}")
        shape = dims
    device = key_caches[0].device
    _check_tensor("block_mapping", block_mapping, ndim=2, dtypes=INDEX_DTYPES, device=device)
    if block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping has shape {tuple(block_mapping.shape)}; expected [num_pairs, 2] (src, dst)")
    if check_values and block_mapping.numel():
        pairs = block_mapping.long().cpu()
        num_blocks = shape[0]
        if int(pairs.min()) < 0 or int(pairs.max()) >= num_blocks:
            raise ValueError(f"block_mapping names a block outside the pool of {num_blocks} blocks")
        src, dst = pairs[:, 0], pairs[:, 1]
        if dst.unique().numel() != dst.numel():
            raise ValueError("block_mapping copies into the same destination block twice")
        if bool(torch.isin(dst, src).any()):
            raise ValueError("block_mapping uses a block as both source and destination; the copy order would matter")
