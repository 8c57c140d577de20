"""Triton kernels that move KV data: the cache write and the copy-on-write block copy.

Both address the cache through its strides, so a per-layer view of a larger pool works.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch, stride_vcb, stride_vcs, stride_vch,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
):
    # One program per (token, kv head): copy one head_dim vector of K and of V into its slot.
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    block = slot // BLOCK_SIZE
    in_block = slot % BLOCK_SIZE
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + offs_d, mask=d_ok)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + offs_d, mask=d_ok)
    tl.store(k_cache_ptr + block * stride_cb + in_block * stride_cs + head * stride_ch + offs_d, k, mask=d_ok)
    tl.store(v_cache_ptr + block * stride_vcb + in_block * stride_vcs + head * stride_vch + offs_d, v, mask=d_ok)


@triton.jit
def _copy_blocks_kernel(
    k_cache_ptr, v_cache_ptr, block_mapping_ptr,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_NUMEL: tl.constexpr, CHUNK: tl.constexpr,
):
    # One program per (pair, chunk of the block's block_size * kv_heads * head_dim elements).
    pair = tl.program_id(0)
    src = tl.load(block_mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * pair + 1).to(tl.int64)
    offs = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    ok = offs < BLOCK_NUMEL
    in_block = offs // (NUM_KV_HEADS * HEAD_DIM)
    head = (offs // HEAD_DIM) % NUM_KV_HEADS
    d = offs % HEAD_DIM
    k_offs = in_block * stride_ks + head * stride_kh + d
    v_offs = in_block * stride_vs + head * stride_vh + d
    tl.store(k_cache_ptr + dst * stride_kb + k_offs, tl.load(k_cache_ptr + src * stride_kb + k_offs, mask=ok), mask=ok)
    tl.store(v_cache_ptr + dst * stride_vb + v_offs, tl.load(v_cache_ptr + src * stride_vb + v_offs, mask=ok), mask=ok)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Same contract as paged_kernels.reference.reshape_and_cache_ref; validated by the caller."""
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    num_tokens, num_kv_heads, head_dim = key.shape
    _reshape_and_cache_kernel[(num_tokens, num_kv_heads)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        BLOCK_SIZE=key_cache.shape[1], HEAD_DIM=head_dim, HEAD_DIM_P=triton.next_power_of_2(head_dim),
    )


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    """Copy (src, dst) block pairs in every layer: one launch per layer (copy-on-write is rare,
    and per-layer launches keep each layer's cache an ordinary tensor, with no pointer tables)."""
    mapping = block_mapping.to(torch.int64).contiguous()
    _, block_size, num_kv_heads, head_dim = key_caches[0].shape
    numel = block_size * num_kv_heads * head_dim
    chunk = min(4096, triton.next_power_of_2(numel))
    grid = (mapping.shape[0], triton.cdiv(numel, chunk))
    for key_cache, value_cache in zip(key_caches, value_caches):
        _copy_blocks_kernel[grid](
            key_cache, value_cache, mapping,
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_NUMEL=numel, CHUNK=chunk,
        )
