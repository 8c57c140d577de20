"""Plain-torch twins of the paged-attention kernels.

These functions are two things at once: the CPU attention backend the engine runs when
there is no GPU, and the oracle every other backend is tested against (the twin itself is
tested against dense causal attention over contiguous K/V). So they stay simple and
vectorised: no Python loop over sequences or tokens, softmax always in fp32.

Cache layout, per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``; slot ``s`` is
``(s // block_size, s % block_size)``. Callers validate arguments first (paged_kernels.validation).
"""

from __future__ import annotations

import torch

# Cap on the fp32 score tensor of one attention pass; longer prefills run in query chunks.
SCORE_BUDGET_BYTES = 256 * 2**20


def reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Write key/value ``[num_tokens, kv_heads, D]`` into their slots; a negative slot is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[keep]
    value_cache[blocks, offsets] = value[keep]


def copy_blocks_ref(key_caches, value_caches, block_mapping) -> None:
    """For every layer, copy block ``src`` onto block ``dst`` for each row (src, dst)."""
    if block_mapping.numel() == 0:
        return
    src, dst = block_mapping[:, 0].long(), block_mapping[:, 1].long()
    for key_cache, value_cache in zip(key_caches, value_caches):  # loop over layers only
        key_cache[dst] = key_cache[src]
        value_cache[dst] = value_cache[src]


def paged_attention_ref(
    query, key_cache, value_cache, *, cu_seqlens_q, seq_lens, block_tables, scale, sliding_window=None
) -> torch.Tensor:
    """Causal attention of flattened queries ``[num_tokens, heads, D]`` over paged context.

    Sequences are split in two groups, each done in one batched pass: decodes (one query
    each, the common case, no padding) and chunks of several queries (padded to the
    longest chunk). Sequences with no new tokens produce nothing.
    """
    num_tokens = query.shape[0]
    out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    device = query.device
    cu = cu_seqlens_q.to(device=device, dtype=torch.long)
    q_lens = cu[1:] - cu[:-1]
    lens = seq_lens.to(device=device, dtype=torch.long)
    args = (query, out, key_cache, value_cache, cu, q_lens, lens, block_tables, scale, sliding_window)
    decode = q_lens == 1
    if bool(decode.all()):  # pure decode: every sequence, no index juggling
        _attend_decodes(torch.arange(q_lens.shape[0], device=device), *args)
        return out
    for group, attend in ((decode, _attend_decodes), (q_lens > 1, _attend_group)):
        seq_idx = group.nonzero().squeeze(1)
        if seq_idx.numel():
            attend(seq_idx, *args)
    return out


def _attend_decodes(seq_idx, query, out, key_cache, value_cache, cu, q_lens, lens, block_tables, scale, window):
    """One query per sequence, over exactly the blocks each sequence uses (no padding).

    Every (sequence, block) pair becomes one row: its scores against the block, then a
    softmax across the rows of each sequence (segment max and sum with scatter/index_add).
    Decode batches mix short and long contexts; padding them all to the longest would
    copy and score far more K/V than the batch holds.
    """
    n = seq_idx.numel()
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    group = query.shape[1] // num_kv_heads
    device = query.device
    lens = lens[seq_idx]
    num_blocks = (lens + block_size - 1) // block_size  # [n]
    pair_seq = torch.repeat_interleave(torch.arange(n, device=device), num_blocks)  # [P]
    first_pair = torch.cumsum(num_blocks, 0) - num_blocks
    block_idx = torch.arange(pair_seq.numel(), device=device) - first_pair[pair_seq]  # [P]
    blocks = block_tables[seq_idx].long()[pair_seq, block_idx]
    key = key_cache.index_select(0, blocks).float().permute(0, 2, 3, 1)  # [P, kvh, D, bs]
    value = value_cache.index_select(0, blocks).float().transpose(1, 2)  # [P, kvh, bs, D]
    token = cu[:-1][seq_idx]
    q = query[token].float().view(n, num_kv_heads, group, head_dim)[pair_seq]  # [P, kvh, G, D]
    scores = torch.matmul(q, key) * scale  # [P, kvh, G, bs]
    pos = block_idx[:, None] * block_size + torch.arange(block_size, device=device)  # [P, bs]
    own = (lens - 1)[pair_seq][:, None]  # the query's position
    allowed = pos <= own
    if window is not None:
        allowed &= pos > own - window
    scores.masked_fill_(~allowed[:, None, None, :], float("-inf"))
    index = pair_seq[:, None, None].expand(-1, num_kv_heads, group)
    seq_max = torch.full((n, num_kv_heads, group), float("-inf"), device=device)
    seq_max.scatter_reduce_(0, index, scores.amax(-1), "amax")
    weights = torch.exp(scores - seq_max[pair_seq][..., None])  # [P, kvh, G, bs]
    denom = torch.zeros(n, num_kv_heads, group, device=device).index_add_(0, pair_seq, weights.sum(-1))
    partial = torch.matmul(weights, value)  # [P, kvh, G, D]
    num = torch.zeros(n, num_kv_heads, group, head_dim, device=device).index_add_(0, pair_seq, partial)
    out[token] = (num / denom[..., None]).reshape(n, -1, head_dim).to(out.dtype)


def _attend_group(seq_idx, query, out, key_cache, value_cache, cu, q_lens, lens, block_tables, scale, window):
    """Attention for the sequences ``seq_idx`` (n of them), written into ``out`` in place."""
    q_lens, lens, starts = q_lens[seq_idx], lens[seq_idx], cu[:-1][seq_idx]
    max_q, max_ctx = int(q_lens.max()), int(lens.max())
    key, value = gather_context(key_cache, value_cache, block_tables[seq_idx], lens, max_ctx)
    num_heads = query.shape[1]
    # Budget for the fp32 scores [n, heads, q_chunk, max_ctx]; chunking bounds memory on long prefills.
    row_bytes = seq_idx.numel() * num_heads * max_ctx * 4
    q_chunk = max(1, min(max_q, SCORE_BUDGET_BYTES // max(row_bytes, 1)))
    k_pos = torch.arange(max_ctx, device=query.device)
    for first in range(0, max_q, q_chunk):  # usually one pass; a few for very long prefills
        j = torch.arange(first, min(first + q_chunk, max_q), device=query.device)
        valid = j[None, :] < q_lens[:, None]  # [n, q]: padded query rows are dropped at the end
        token = (starts[:, None] + j[None, :])[valid]
        if max_q == 1:  # decodes: one query per sequence, nothing to pad
            q = query[token].unsqueeze(1)
        else:
            q = query.new_zeros(seq_idx.numel(), j.numel(), *query.shape[1:])
            q[valid] = query[token]
        q_pos = (lens - q_lens)[:, None] + j[None, :]  # absolute position of each query, [n, q]
        allowed = (k_pos <= q_pos[..., None]) & (k_pos < lens[:, None, None])  # [n, q, ctx]
        if window is not None:
            allowed &= k_pos > q_pos[..., None] - window
        out[token] = masked_attention(q, key, value, allowed, scale)[valid]


def gather_context(key_cache, value_cache, block_tables, seq_lens, max_ctx):
    """Each sequence's K and V in position order, fp32 ``[kv_heads, n, max_ctx, D]``.

    index_select copies whole blocks (far faster on CPU than advanced indexing); one more
    pass puts heads first, as the batched matmul wants, and converts to fp32. Positions past
    a sequence's length read block 0; the caller masks them out.
    """
    n = block_tables.shape[0]
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    num_used = -(-max_ctx // block_size)
    tables = block_tables[:, :num_used].long()
    used = torch.arange(num_used, device=tables.device) * block_size < seq_lens[:, None]
    flat = torch.where(used, tables, 0).flatten()  # padding entries may hold anything; never index with them

    def gather(cache):
        blocks = cache.index_select(0, flat).view(n, num_used * block_size, num_kv_heads, head_dim)
        return blocks[:, :max_ctx].permute(2, 0, 1, 3).to(torch.float32, memory_format=torch.contiguous_format)

    return gather(key_cache), gather(value_cache)


def masked_attention(q, key, value, allowed, scale) -> torch.Tensor:
    """q ``[n, Q, H, D]``, key/value fp32 ``[kv_heads, n, C, D]``, allowed ``[n, Q, C]`` -> ``[n, Q, H, D]``.

    GQA without copying K/V: query heads are viewed as ``[kv_heads, group]`` and each group
    rides along the query axis of one batched matmul over (kv_heads, n). Rows with nothing
    allowed (padding) give NaN and are dropped by the caller.
    """
    n, num_q, num_heads, head_dim = q.shape
    num_kv_heads, _, num_ctx, _ = key.shape
    group = num_heads // num_kv_heads
    # [n, Q, kvh, G, D] -> [kvh, n, G*Q, D]
    qf = q.float().view(n, num_q, num_kv_heads, group, head_dim).permute(2, 0, 3, 1, 4)
    qf = qf.reshape(num_kv_heads, n, group * num_q, head_dim)
    scores = qf @ key.transpose(-1, -2) * scale  # [kvh, n, G*Q, C]
    scores = scores.view(num_kv_heads, n, group, num_q, num_ctx)
    scores.masked_fill_(~allowed[None, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(num_kv_heads, n, group * num_q, num_ctx)
    o = probs @ value  # [kvh, n, G*Q, D]
    o = o.view(num_kv_heads, n, group, num_q, head_dim).permute(1, 3, 0, 2, 4)
    return o.reshape(n, num_q, num_heads, head_dim).to(q.dtype)
