"""The torch twin (CPU backend and oracle) against dense causal attention on contiguous K/V."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_attention_cases import TOLERANCE, dense_attention, make_case

from paged_kernels import get_backend

torch.set_num_threads(1)  # CI shares 2 cores between xdist workers


def check_against_dense(case, *, sliding_window=None):
    out = get_backend("torch-reference").paged_attention(
        case.query, case.key_cache, case.value_cache, **case.kwargs(sliding_window=sliding_window)
    )
    assert out.shape == case.query.shape and out.dtype == case.query.dtype
    tol = TOLERANCE[case.query.dtype]
    torch.testing.assert_close(out.double(), dense_attention(case, sliding_window=sliding_window), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_mixed_prefill_and_decode_batch(dtype, block_size):
    # Decodes, a fresh prefill, a chunk continuing a prefix, and lengths at / one past a block boundary.
    b = block_size
    case = make_case(q_lens=[1, 7, 3, 1, 1], seq_lens=[2 * b, 7, 3 * b + 1 + 3, b + 1, 1], block_size=b, dtype=dtype)
    check_against_dense(case)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (8, 1)])
def test_gqa_and_mqa(num_heads, num_kv_heads):
    case = make_case(q_lens=[5, 1, 2], seq_lens=[9, 13, 4], num_heads=num_heads, num_kv_heads=num_kv_heads)
    check_against_dense(case)


@pytest.mark.parametrize("window", [1, 3, 8, 100])
def test_sliding_window(window):
    case = make_case(q_lens=[10, 1, 4], seq_lens=[10, 17, 12], block_size=4)
    check_against_dense(case, sliding_window=window)


def test_pure_decode_batch_uses_only_its_context():
    case = make_case(q_lens=[1] * 6, seq_lens=[1, 4, 5, 8, 9, 30], block_size=4)
    check_against_dense(case)


def test_shared_prefix_blocks():
    case = make_case(q_lens=[1, 3, 1], seq_lens=[12, 14, 9], block_size=4, shared_prefix_blocks=2)
    assert case.block_tables[1, 0] == case.block_tables[0, 0]  # the builder really shares blocks
    check_against_dense(case)


def test_sequences_without_new_tokens_and_empty_batch():
    case = make_case(q_lens=[0, 2, 0], seq_lens=[5, 6, 3], block_size=4)
    check_against_dense(case)
    empty = make_case(q_lens=[], seq_lens=[], block_size=4)
    out = get_backend("torch-reference").paged_attention(empty.query, empty.key_cache, empty.value_cache, **empty.kwargs())
    assert out.shape == (0, 4, 16)


def test_long_prefill_in_query_chunks(monkeypatch):
    # Force the score budget down so the prefill runs in several query chunks.
    from paged_kernels import reference

    monkeypatch.setattr(reference, "SCORE_BUDGET_BYTES", 4 * 4 * 40 * 8)
    case = make_case(q_lens=[40, 1], seq_lens=[40, 9], block_size=8)
    check_against_dense(case)


@settings(max_examples=25, deadline=None)
@given(
    data=st.data(),
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    heads=st.sampled_from([(2, 1), (4, 2), (3, 3)]),
    head_dim=st.sampled_from([8, 16, 24]),
    window=st.one_of(st.none(), st.integers(1, 20)),
)
def test_random_batches(data, block_size, heads, head_dim, window):
    num_seqs = data.draw(st.integers(1, 5))
    seq_lens = data.draw(st.lists(st.integers(1, 40), min_size=num_seqs, max_size=num_seqs))
    q_lens = [data.draw(st.integers(0, s)) for s in seq_lens]
    case = make_case(q_lens=q_lens, seq_lens=seq_lens, num_heads=heads[0], num_kv_heads=heads[1],
                     head_dim=head_dim, block_size=block_size, seed=data.draw(st.integers(0, 2**16)))
    check_against_dense(case, sliding_window=window)


def test_reshape_and_cache_writes_slots_and_skips_negatives():
    kc, vc = torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8)
    key, value = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    slots = torch.tensor([5, -1, 11, 0])
    get_backend("torch-reference").reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc[1, 1], key[0]) and torch.equal(vc[2, 3], value[2]) and torch.equal(kc[0, 0], key[3])
    assert int((kc.abs().sum(-1).sum(-1) > 0).sum()) == 3  # the skipped token wrote nothing


def test_copy_blocks_copies_every_layer():
    layers = [(torch.randn(5, 2, 1, 4), torch.randn(5, 2, 1, 4)) for _ in range(3)]
    before = [(k.clone(), v.clone()) for k, v in layers]
    get_backend("torch-reference").copy_blocks([k for k, _ in layers], [v for _, v in layers], torch.tensor([[0, 3], [2, 4]]))
    for (k, v), (k0, v0) in zip(layers, before):
        assert torch.equal(k[3], k0[0]) and torch.equal(v[4], v0[2])
        assert torch.equal(k[:3], k0[:3]) and torch.equal(v[:3], v0[:3])
