"""Unified paged attention in Triton: one launch for a mixed batch of prefill chunks and decodes.

Work split. Grid = (query tiles, kv heads, KV splits). A program owns BLOCK_Q consecutive
queries of one sequence and the GROUP query heads that share one kv head, i.e. a
``[BLOCK_M = BLOCK_Q * GROUP, D]`` tile of queries (GQA without repeating K/V). It walks
that sequence's context TILE_N tokens at a time through the block table (a per-token block
lookup, so any block size works, 1 to 128+), with an online softmax in fp32.

Sequence lookup without a host sync: sequence i's query tiles start at program
``cu_seqlens_q[i] // BLOCK_Q + i``, which is increasing in i and leaves room for every tile, so
a program finds its sequence by binary search over cu_seqlens_q and the grid size
``num_tokens // BLOCK_Q + num_seqs`` depends only on shapes. Programs past a sequence's
queries exit at once.

Split-KV (flash-decoding): with few sequences and long contexts, each program covers only a
slice of the context tiles, writes an fp32 partial output with its log-sum-exp, and a second
small kernel merges the slices. The number of splits is a runtime argument (only "split or
not" is a compile-time constant), so a server whose batch shape changes every step does not
JIT-compile a new kernel for each split count it meets.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

MIN_CHUNK_PER_SPLIT = 512  # tokens of context below which splitting further does not pay
PROGRAMS_PER_SM = 2  # the split count aims at this many programs per SM (_pick_num_splits)
# Software pipelining depth of the context loop on CUDA. Triton's default is 3; on an H200 two
# stages were as fast or faster at every tuned shape, by 9-13 % without splits (batch 64-128,
# paged_kernels.tune, 2026-12-04).
NUM_STAGES = 2


@triton.jit
def _find_sequence(cu_seqlens_q_ptr, num_seqs, pid, BLOCK_Q: tl.constexpr):
    # Largest i with cu_seqlens_q[i] // BLOCK_Q + i <= pid.
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        if start <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _dot(a, b, FP32_DOT: tl.constexpr):
    # fp32 inputs: exact products ("ieee", not tf32) to match the twin. Also used for bf16 under
    # TRITON_INTERPRET, whose tl.dot multiplies bf16 bit patterns (triton-lang/triton#11584);
    # bf16 x bf16 products are exact in fp32, so only the summation order differs from the GPU.
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


# Counts that change from step to step are not specialised on (Triton otherwise compiles a
# variant for value 1 and for multiples of 16).
@triton.jit(do_not_specialize=["num_seqs", "sliding_window", "num_splits"])
def _paged_attention_kernel(
    out_ptr, lse_ptr, q_ptr, k_cache_ptr, v_cache_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_tables_ptr,
    scale, num_seqs, sliding_window, num_splits,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ot, stride_oh, stride_os,  # out: [num_tokens, heads, D] or partials [num_tokens, heads, splits, D]
    stride_lt, stride_lh,  # lse: [num_tokens, heads, splits]
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, SPLIT_KV: tl.constexpr,
    USE_WINDOW: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pid_q = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = _find_sequence(cu_seqlens_q_ptr, num_seqs, pid_q, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    q_tile = pid_q - (q_start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_q_pos = seq_len - q_len  # position of this sequence's first new token

    # Rows of the tile: query index within the sequence and query head.
    offs_m = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_idx < q_len)
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    token = (q_start + q_idx).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q_pos = first_q_pos + q_idx  # [BLOCK_M]

    # Context this tile needs: up to its last query (causal), from its first query's window.
    kv_end = first_q_pos + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len)
    kv_begin = 0
    if USE_WINDOW:
        kv_begin = tl.maximum(first_q_pos + q_tile * BLOCK_Q - sliding_window + 1, 0)
    first_tile = kv_begin // TILE_N
    num_tiles = tl.cdiv(kv_end, TILE_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, first_tile + num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for t in range(tile_lo, tile_hi):
        offs_n = t * TILE_N + tl.arange(0, TILE_N)
        n_ok = offs_n < kv_end
        block = tl.load(table + offs_n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        in_block = offs_n % BLOCK_SIZE
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + block[:, None] * stride_kb + in_block[:, None] * stride_ks
                    + kv_head * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + block[:, None] * stride_vb + in_block[:, None] * stride_vs
                    + kv_head * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), FP32_DOT)
        allowed = row_ok[:, None] & n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            allowed = allowed & (offs_n[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(allowed, s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, FP32_DOT)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_safe[:, None]
    out_offs = token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    if not SPLIT_KV:
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        tl.store(out_ptr + out_offs + split * stride_os, acc, mask=row_ok[:, None] & d_ok[None, :])
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe))
        tl.store(lse_ptr + token * stride_lt + head * stride_lh + split, lse, mask=row_ok)


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(
    out_ptr, partial_ptr, lse_ptr, num_splits,
    stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, SPLITS_P: tl.constexpr,
):
    # One program per (token, head): weight each split's normalised output by exp(lse - max lse).
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P)
    s_ok = offs_s < num_splits
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    lse = tl.load(lse_ptr + token * stride_lt + head * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    weight = tl.exp(lse - tl.max(lse, 0))  # splits with no context have lse = -inf: weight 0
    part = tl.load(partial_ptr + token * stride_pt + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                   mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(part * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _pick_num_splits(device: torch.device, active_programs: int, max_context: int) -> int:
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return splits_for(sms, active_programs, max_context)


def splits_for(sms: int, active_programs: int, max_context: int) -> int:
    """Split the context when the grid alone would leave SMs idle or lightly loaded (few, long
    sequences): about PROGRAMS_PER_SM busy programs per SM, the count rounded up to a power of
    two, each split with >= MIN_CHUNK_PER_SPLIT tokens. Tuned on an H200 (paged_kernels.tune,
    2026-12-04, bf16, 32/8 heads, head_dim 128): at batch 32 two splits beat the three that
    four programs per SM asked for by 13-17 % at 2k-32k, and an odd count was slower than both
    powers of two around it; at batch 64 one split beat two by 6 %."""
    wanted = PROGRAMS_PER_SM * sms / max(active_programs, 1)
    wanted = 1 if wanted <= 1 else 1 << math.ceil(math.log2(wanted))
    return max(1, min(wanted, math.ceil(max_context / MIN_CHUNK_PER_SPLIT), 64))


def default_num_splits(config: dict, *, num_tokens: int, num_seqs: int, num_kv_heads: int, max_context: int,
                       device: torch.device) -> int:
    """The split count paged_attention uses when given none (also what paged_kernels.tune starts from)."""
    active = max(num_seqs, num_tokens // config["BLOCK_Q"]) * num_kv_heads
    return _pick_num_splits(device, active, max_context)


# Launch parameters a tuner may force (paged_kernels.tune): TILE_N replaces launch_config's choice,
# num_warps replaces Triton's launch default (4), num_stages NUM_STAGES, num_splits the split pick.
OVERRIDABLE = ("TILE_N", "num_warps", "num_stages", "num_splits")


def check_overrides(overrides: dict) -> None:
    """Raise ValueError naming the key when a launch override is unknown or out of range."""
    for key, value in overrides.items():
        if key not in OVERRIDABLE:
            raise ValueError(f"unknown launch override {key!r}; choose from {OVERRIDABLE}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"launch override {key}={value!r} must be a positive int")
        if key == "TILE_N" and (value < 16 or value & (value - 1)):
            raise ValueError(f"launch override TILE_N={value} must be a power of two >= 16 (tl.dot's smallest tile)")
        if key == "num_warps" and (value > 32 or value & (value - 1)):
            raise ValueError(f"launch override num_warps={value} must be a power of two <= 32")


def launch_config(*, num_tokens: int, num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int) -> dict:
    """Tile sizes for a launch, from shapes only (no host sync)."""
    group = num_heads // num_kv_heads
    pure_decode = num_tokens == num_seqs  # a hint only; correctness does not depend on it
    # Decode tiles hold one query's GROUP heads (padded to tl.dot's 16 rows); prefill tiles more
    # queries, fewer for head_dim 256 to keep the tile in registers.
    min_rows = 16 if pure_decode else (32 if head_dim > 128 else 64)
    block_m = max(min_rows, triton.next_power_of_2(group))
    return dict(GROUP=group, BLOCK_M=block_m, BLOCK_Q=max(1, block_m // group),
                TILE_N=32 if head_dim > 128 else 64, HEAD_DIM=head_dim,
                HEAD_DIM_P=max(16, triton.next_power_of_2(head_dim)))


def paged_attention(
    query, key_cache, value_cache, *, cu_seqlens_q, seq_lens, block_tables, scale, sliding_window=None,
    num_splits: int | None = None, overrides: dict | None = None,
) -> torch.Tensor:
    """Same contract as paged_kernels.reference.paged_attention_ref; arguments are validated by the caller.
    num_splits: KV splits per query tile (None: chosen from shapes and the device).
    overrides: launch parameters to force, for tuning: a dict with any of OVERRIDABLE (checked here, ValueError
    naming a bad key). None launches exactly as without the argument."""
    query = query if query.stride(-1) == 1 else query.contiguous()
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = seq_lens.shape[0]
    config = launch_config(num_tokens=num_tokens, num_seqs=num_seqs, num_heads=num_heads,
                           num_kv_heads=num_kv_heads, head_dim=head_dim)
    launch_options = {"num_stages": NUM_STAGES}  # num_warps: Triton's default unless overridden
    if overrides is not None:
        check_overrides(overrides)
        if "num_splits" in overrides and num_splits is not None:
            raise ValueError("num_splits given both as an argument and in overrides; give one")
        num_splits = overrides.get("num_splits", num_splits)
        config["TILE_N"] = overrides.get("TILE_N", config["TILE_N"])
        launch_options.update({k: overrides[k] for k in ("num_warps", "num_stages") if k in overrides})
    programs = num_tokens // config["BLOCK_Q"] + num_seqs
    if num_splits is None:
        num_splits = default_num_splits(config, num_tokens=num_tokens, num_seqs=num_seqs, num_kv_heads=num_kv_heads,
                                        max_context=block_tables.shape[1] * block_size, device=query.device)
    out = torch.empty_like(query)
    if num_splits > 1:
        partial = torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=query.device)
        target, target_strides = partial, (partial.stride(0), partial.stride(1), partial.stride(2))
    else:
        lse = out  # unused
        target, target_strides = out, (out.stride(0), out.stride(1), 0)
    _paged_attention_kernel[(programs, num_kv_heads, num_splits)](
        target, lse, query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables,
        float(scale), num_seqs, int(sliding_window or 0), num_splits,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), *target_strides,
        lse.stride(0) if num_splits > 1 else 0, lse.stride(1) if num_splits > 1 else 0,
        BLOCK_SIZE=block_size, SPLIT_KV=num_splits > 1, USE_WINDOW=sliding_window is not None, **config,
        FP32_DOT=query.dtype == torch.float32 or (query.dtype == torch.bfloat16 and _interpreting()), **launch_options,
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_tokens, num_heads)](
            out, partial, lse, num_splits, out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
            lse.stride(0), lse.stride(1), HEAD_DIM=head_dim, HEAD_DIM_P=config["HEAD_DIM_P"],
            SPLITS_P=max(16, triton.next_power_of_2(num_splits)),  # one variant up to 16 splits
        )
    return out
