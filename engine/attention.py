"""Paged attention served to unmodified Hugging Face models through AttentionInterface.

The runner loads models with `attn_implementation=PAGED_ATTENTION`; every attention layer
that dispatches through transformers' interface then writes its new K/V into the block
pool and attends over its sequence's pages. transformers builds no mask for an
implementation it has no mask function for, so the causal structure comes from the
metadata alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface

PAGED_ATTENTION = "paged_kv"


@dataclass
class AttentionMetadata:
    """Per-step batch layout, built once and passed down to every layer."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs], context incl. new tokens
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (key, value)
    backend: object  # a kernels backend


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None,
                            scaling: float | None = None, sliding_window: int | None = None,
                            paged_metadata: AttentionMetadata | None = None, **_):
    if paged_metadata is None:
        raise RuntimeError("a model loaded for the paged engine was called without paged_metadata")
    meta = paged_metadata
    # query: [1, num_heads, num_tokens, head_dim]; key/value: [1, num_kv_heads, num_tokens, head_dim]
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    key_cache, value_cache = meta.kv_caches[module.layer_idx]
    meta.backend.reshape_and_cache(k, v, key_cache, value_cache, meta.slot_mapping)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = meta.backend.paged_attention(
        q, key_cache, value_cache, cu_seqlens_q=meta.cu_seqlens_q, seq_lens=meta.seq_lens,
        block_tables=meta.block_tables, scale=scale, sliding_window=sliding_window)
    return out.unsqueeze(0), None  # [1, num_tokens, num_heads, head_dim]


AttentionInterface.register(PAGED_ATTENTION, paged_attention_forward)
