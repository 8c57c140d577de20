"""The fast CPU paged attention: gather each sequence's blocks, one SDPA call per bucket.

paged_kernels.reference stays the oracle; this is the path the engine runs on CPU. Sequences are
grouped into buckets (decodes by context, chunks of several queries by query count, each
rounded up to a power of two, so padding at most doubles a bucket's work); each bucket
gathers its sequences' blocks into one padded ``[n, ctx, kv_heads, D]`` tensor (one
``index_select`` of whole blocks, no per-token indexing) and runs
``torch.nn.functional.scaled_dot_product_attention`` once, with GQA done by SDPA
(``enable_gqa``) and the causal / length / window structure in one boolean mask.

Why this shape: on CPU the twin's many tiny per-block matmuls cost far more than one
flash-attention call over the padded context (tests/kernels hold both to the same answers;
benchmarks/bench_decode.py measures the difference in the engine).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from paged_kernels import reference

# Cap on the boolean mask of one SDPA call ([n, 1, q, ctx] bytes); longer prefills run in
# query chunks. SDPA's CPU flash kernel tiles the scores itself, so the mask is the big part.
MASK_BUDGET_BYTES = 64 * 2**20

# Gather buffers reused from call to call (per thread: the engine steps on one thread, tests
# may run several). A fresh multi-MiB tensor per layer costs page faults on first touch that
# were measured to take longer than the copy itself in the engine's step.
_scratch = threading.local()


def _buffer(slot: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    bufs = _scratch.__dict__.setdefault("bufs", {})
    key = (slot, dtype, device)
    buf = bufs.get(key)
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: writable in and out of inference mode
            buf = bufs[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


# The rows and slots of the last step's cache write (every layer gets the same slot_mapping),
# per thread, keyed by a weak reference to that tensor and its version counter.
_writes = threading.local()


def reshape_and_cache_slots(key, value, key_cache, value_cache, slot_mapping) -> None:
    """The twin's cache write (same slots, same values) as one ``index_copy_`` per cache into
    its flattened ``[slots, kv_heads, D]`` view; the slots and the rows to keep (negative slots
    are skipped) are worked out once per step. The twin's indexing takes ~10 small ops a layer,
    some of them parallel regions: on two busy cores each of those could wait milliseconds
    for the second thread (measured 40 ms against 32 us for this write)."""
    if not key_cache.is_contiguous() or not value_cache.is_contiguous():
        return reference.reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping)
    rows, slots = _write_plan(slot_mapping)
    if rows is not None:
        key, value = key[rows], value[rows]
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slots, key)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slots, value)


def _write_plan(slot_mapping):
    # an inference tensor (the engine's, made fresh each step) keeps no version counter
    version = None if slot_mapping.is_inference() else slot_mapping._version
    cached = getattr(_writes, "last", None)
    if cached is not None and cached[0]() is slot_mapping and cached[1] == version:
        return cached[2]
    keep = slot_mapping >= 0
    if bool(keep.all()):
        plan = (None, slot_mapping.long())
    else:
        rows = keep.nonzero().squeeze(1)
        plan = (rows, slot_mapping[rows].long())
    _writes.last = (weakref.ref(slot_mapping), version, plan)
    return plan


@dataclass
class _Pass:
    """One SDPA call's queries: rows ``token`` of the step (``valid`` picks them out of the
    padded ``[n, q]`` grid) and the mask, or None for whole prompts (causal, no mask); for a
    decode bucket the mask is an additive fp32 bias (0 or -inf), ``[n, 1, ctx]``."""

    token: torch.Tensor
    valid: torch.Tensor | None
    width: int
    mask: torch.Tensor | None


@dataclass
class _Bucket:
    n: int
    max_q: int
    flat: torch.Tensor  # [n * num_used] block ids to gather, padding entries read block 0
    num_used: int
    passes: list[_Pass]


# The plan of the last step: every layer of a step gets the same metadata tensors, so the
# buckets, block lists and masks are built once per step, not once per layer. Kept per
# thread, keyed by weak references to those tensors (a later step's new tensors never
# match, even at a reused address) and by what else shapes the plan.
_plans = threading.local()


def paged_attention_sdpa(
    query, key_cache, value_cache, *, cu_seqlens_q, seq_lens, block_tables, scale, sliding_window=None
) -> torch.Tensor:
    """Same contract as paged_kernels.reference.paged_attention_ref (docs/INTERFACES.md)."""
    out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    plan = _plan(cu_seqlens_q, seq_lens, block_tables, key_cache.shape[1], sliding_window,
                 query.device)
    for bucket in plan:
        key, value = _gather(key_cache, value_cache, bucket)
        if bucket.max_q == 1:
            _decode(query, key, value, bucket.passes[0], scale, out)
        else:
            _chunks(query, key, value, bucket, scale, out)
    return out


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    return torch.ceil(torch.log2(x.clamp(min=1).double())).long()


def _plan(cu_seqlens_q, seq_lens, block_tables, block_size, window, device) -> list[_Bucket]:
    cached = getattr(_plans, "last", None)
    tensors = (cu_seqlens_q, seq_lens, block_tables)
    extra = (block_size, window, device)
    if cached is not None and cached[1] == extra and all(
            ref() is t for ref, t in zip(cached[0], tensors)):
        return cached[2]
    plan = _build_plan(cu_seqlens_q, seq_lens, block_tables, block_size, window, device)
    _plans.last = (tuple(weakref.ref(t) for t in tensors), extra, plan)
    return plan


def _build_plan(cu_seqlens_q, seq_lens, block_tables, block_size, window, device) -> list[_Bucket]:
    cu = cu_seqlens_q.to(device=device, dtype=torch.long)
    q_lens = cu[1:] - cu[:-1]
    lens = seq_lens.to(device=device, dtype=torch.long)
    # decodes bucket by context (in blocks), chunks by query count
    size = torch.where(q_lens == 1, (lens + block_size - 1) // block_size, q_lens)
    keys = torch.where(q_lens == 1, 0, 1) * 64 + _ceil_log2(size)  # (kind, power-of-two bucket)
    keys = torch.where(q_lens == 0, -1, keys)  # sequences with no new tokens: nothing to do
    plan = []
    for key in torch.unique(keys).tolist():
        if key < 0:
            continue
        seq_idx = (keys == key).nonzero().squeeze(1)
        plan.append(_bucket(seq_idx, cu, q_lens, lens, block_tables, block_size, window))
    return plan


def _bucket(seq_idx, cu, q_lens, lens, block_tables, block_size, window) -> _Bucket:
    """The sequences ``seq_idx`` (n of them): their blocks, query rows and masks."""
    n = seq_idx.numel()
    device = cu.device
    q_lens, lens, starts = q_lens[seq_idx], lens[seq_idx], cu[:-1][seq_idx]
    max_q, max_ctx = int(q_lens.max()), int(lens.max())
    # each sequence's blocks in position order; table entries past a sequence's length are
    # padding that may hold anything, so they read block 0 instead (the mask hides them)
    num_used = -(-max_ctx // block_size)
    tables = block_tables[seq_idx, :num_used].to(device=device, dtype=torch.long)
    used = torch.arange(num_used, device=device) * block_size < lens[:, None]
    flat = torch.where(used, tables, 0).flatten()
    num_ctx = num_used * block_size
    k_pos = torch.arange(num_ctx, device=device)
    if max_q == 1:  # decodes: one query per sequence, nothing to pad
        allowed = k_pos < lens[:, None]  # [n, ctx]
        if window is not None:
            allowed &= k_pos > (lens - 1)[:, None] - window
        # _decode adds it to the scores: 0 where allowed, -inf elsewhere, [n, 1, ctx] fp32
        bias = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, float("-inf"))
        return _Bucket(n, 1, flat, num_used, [_Pass(starts, None, 1, bias[:, None, :])])
    fresh = window is None and bool((lens == q_lens).all())  # whole prompts, no context
    q_chunk = max(1, min(max_q, MASK_BUDGET_BYTES // max(n * num_ctx, 1)))
    passes = []
    for first in range(0, max_q, q_chunk):  # usually one pass; a few for very long prefills
        j = torch.arange(first, min(first + q_chunk, max_q), device=device)
        valid = j[None, :] < q_lens[:, None]  # [n, q]: padded query rows are dropped at the end
        token = (starts[:, None] + j[None, :])[valid]
        if fresh and first == 0 and j.numel() == max_q:
            # every sequence's prompt starts here and no window: causal from the top-left
            # corner is exact for each real row (row i sees keys 0..i of its own prompt;
            # padding keys lie beyond every real row), so SDPA needs no mask
            passes.append(_Pass(token, valid, max_q, None))
            continue
        q_pos = (lens - q_lens)[:, None] + j[None, :]  # absolute position of each query, [n, q]
        # causal (which also keeps each query inside its own sequence's context) and window;
        # padded query rows see position 0 at least, so no row is empty (they are dropped anyway)
        allowed = k_pos <= q_pos.clamp(max=(lens - 1)[:, None])[..., None]  # [n, q, ctx]
        if window is not None:
            allowed &= k_pos > q_pos[..., None] - window
        passes.append(_Pass(token, valid, j.numel(), allowed[:, None]))
    return _Bucket(n, max_q, flat, num_used, passes)


def _chunks(query, key, value, bucket: _Bucket, scale, out) -> None:
    """Buckets of chunks (several queries per sequence): padded queries, one SDPA per pass."""
    num_heads, head_dim = query.shape[1:]
    for p in bucket.passes:
        q = query.new_zeros(bucket.n, p.width, num_heads, head_dim)
        q[p.valid] = query[p.token]
        q = q.transpose(1, 2).to(key.dtype)  # [n, H, q, D]
        if p.mask is None:
            o = F.scaled_dot_product_attention(
                q, key[:, :, :bucket.max_q], value[:, :, :bucket.max_q], is_causal=True,
                scale=scale, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, key, value, attn_mask=p.mask, scale=scale,
                                               enable_gqa=True)
        out[p.token] = o.transpose(1, 2)[p.valid].to(out.dtype)  # [n, q, H, D] -> [tokens, H, D]


def _decode(query, key, value, p: _Pass, scale, out) -> None:
    """One query per sequence: per KV head, two batched matmuls over the gathered blocks in
    place (``key[:, h]`` is a strided ``[n, ctx, D]`` batch BLAS takes without a copy) and a
    masked softmax; GQA by grouping each KV head's query heads, so K/V are never expanded.
    On CPU this beat SDPA for a single query row (about 2.7x in benchmarks/bench_decode.py's
    shapes, an earlier torch; with torch 2.13 SDPA measured faster, docs/benchmarks/engine.md,
    at a last-bits difference); SDPA stays for chunks of several queries, where it wins."""
    q = query[p.token]
    n, num_heads, head_dim = q.shape
    num_kv_heads = key.shape[1]
    qg = q.to(key.dtype).view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    res = torch.empty_like(qg)
    bias = p.mask.to(key.dtype)
    for h in range(num_kv_heads):
        # scale * (q @ k^T) + bias in one call, bit for bit what bmm, mul_ and masked_fill_
        # gave (the bias adds 0 or -inf): fewer ops between the matmuls, each a wait on two
        # busy cores
        scores = torch.baddbmm(bias, qg[:, h], key[:, h].transpose(1, 2), alpha=scale)
        res[:, h] = torch.bmm(torch.softmax(scores, dim=-1), value[:, h])  # scores: [n, g, ctx]
    out[p.token] = res.view(n, num_heads, head_dim).to(out.dtype)


def _gather(key_cache, value_cache, bucket: _Bucket):
    """K and V of each sequence in position order, ``[n, kv_heads, ctx, D]`` (a strided view),
    ``ctx`` the bucket's longest context rounded up to whole blocks. Half-precision caches
    are widened to fp32 here (softmax and sums in fp32, as the twin)."""
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    flat, n = bucket.flat, bucket.n

    def gather(cache, slot):
        shape = (flat.numel(), *cache.shape[1:])
        blocks = _buffer(slot, flat.numel() * cache[0].numel(), cache.dtype, cache.device).view(shape)
        torch.index_select(cache, 0, flat, out=blocks)
        if blocks.dtype != torch.float32:
            blocks = blocks.float()
        # [n * blocks, bs, kvh, D] -> [n, ctx, kvh, D] -> [n, kvh, ctx, D]: SDPA takes the strides
        return blocks.view(n, bucket.num_used * block_size, num_kv_heads, head_dim).transpose(1, 2)

    return gather(key_cache, 0), gather(value_cache, 1)
