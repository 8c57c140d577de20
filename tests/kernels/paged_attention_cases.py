"""Builders shared by the kernel tests: paged batches made from contiguous K/V, and the dense
causal attention every backend is ultimately compared with.

The helpers loop over sequences on purpose: they are the slow, obviously-correct side.
(The module name is unique across tests/: pytest imports test helpers by basename.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_BLOCK = 10**6  # block-table padding that would crash if a backend read it


@dataclass
class PagedCase:
    query: torch.Tensor  # [num_tokens, heads, D]
    key_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, D]
    value_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    keys: list  # per sequence, contiguous [seq_len, kv_heads, D]
    values: list
    scale: float

    def to(self, device) -> "PagedCase":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        return PagedCase(**moved)

    def kwargs(self, **extra) -> dict:
        return dict(cu_seqlens_q=self.cu_seqlens_q, seq_lens=self.seq_lens, block_tables=self.block_tables,
                    scale=self.scale, **extra)


def make_case(
    *, q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32,
    seed=0, shared_prefix_blocks=0, spare_blocks=3,
) -> PagedCase:
    """A batch whose sequence i has ``seq_lens[i]`` tokens of context, the last ``q_lens[i]`` new.

    Physical blocks are a random permutation of the pool (non-contiguous, out of order), with
    spare blocks left unused. With ``shared_prefix_blocks`` = b, every sequence long enough
    shares its first b blocks with sequence 0 (same physical blocks, same K/V), like a prefix hit.
    """
    gen = torch.Generator().manual_seed(seed)
    assert all(s >= q for q, s in zip(q_lens, seq_lens))
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per_seq, default=0) + 1  # one padding column at least
    tables = torch.full((len(seq_lens), max_blocks), PAD_BLOCK, dtype=torch.int32)
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    keys, values = [], []
    for i, (n_blocks, length) in enumerate(zip(blocks_per_seq, seq_lens)):
        k = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(dtype)
        for b in range(n_blocks):
            if i > 0 and b < shared_prefix_blocks and b < blocks_per_seq[0] and (b + 1) * block_size <= min(
                length, seq_lens[0]
            ):
                phys = int(tables[0, b])  # shared full block: reuse sequence 0's block and content
                k[b * block_size:(b + 1) * block_size] = keys[0][b * block_size:(b + 1) * block_size]
                v[b * block_size:(b + 1) * block_size] = values[0][b * block_size:(b + 1) * block_size]
            else:
                phys = perm.pop()
            tables[i, b] = phys
            n = min(block_size, length - b * block_size)
            key_cache[phys, :n] = k[b * block_size:b * block_size + n]
            value_cache[phys, :n] = v[b * block_size:b * block_size + n]
        keys.append(k)
        values.append(v)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    query = torch.randn(int(cu[-1]), num_heads, head_dim, generator=gen).to(dtype)
    return PagedCase(query, key_cache, value_cache, cu, torch.tensor(seq_lens, dtype=torch.int32), tables,
                     keys, values, head_dim**-0.5)


def dense_attention(case: PagedCase, *, sliding_window=None) -> torch.Tensor:
    """Float64 causal attention over each sequence's contiguous K/V, ``[num_tokens, heads, D]``."""
    outs = []
    num_heads = case.query.shape[1]
    for i, (k, v) in enumerate(zip(case.keys, case.values)):
        q = case.query[int(case.cu_seqlens_q[i]):int(case.cu_seqlens_q[i + 1])].double()
        if q.shape[0] == 0:
            continue
        group = num_heads // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale
        q_pos = torch.arange(k.shape[0] - q.shape[0], k.shape[0])[:, None]
        k_pos = torch.arange(k.shape[0])[None, :]
        mask = k_pos <= q_pos
        if sliding_window is not None:
            mask &= k_pos > q_pos - sliding_window
        scores = scores.masked_fill(~mask, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    if not outs:
        return torch.empty(0, num_heads, case.query.shape[2], dtype=torch.float64)
    return torch.cat(outs)


TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
