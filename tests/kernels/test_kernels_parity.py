"""One parity suite for every attention backend: each runs the same batches and must match the
torch twin (paged_kernels.reference) and dense causal attention over contiguous K/V.

Under TRITON_INTERPRET the Triton kernels run on CPU, so the cases stay small; they still cover
several context tiles, block boundaries, GQA groups that are not powers of two, padded head
dims, windows and split-KV.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged_attention_cases import TOLERANCE, dense_attention, make_case

from paged_kernels import reference

torch.set_num_threads(1)


def run_and_compare(backend, case, device, *, sliding_window=None):
    case = case.to(device)
    out = backend.paged_attention(case.query, case.key_cache, case.value_cache,
                                  **case.kwargs(sliding_window=sliding_window))
    assert out.shape == case.query.shape and out.dtype == case.query.dtype and out.device == case.query.device
    twin = reference.paged_attention_ref(case.query, case.key_cache, case.value_cache,
                                         **case.kwargs(sliding_window=sliding_window))
    tol = TOLERANCE[case.query.dtype]
    torch.testing.assert_close(out, twin, atol=tol, rtol=tol)
    torch.testing.assert_close(out.double().cpu(), dense_attention(case.to("cpu"), sliding_window=sliding_window),
                               atol=tol, rtol=tol)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mixed_batch_at_block_boundaries(backend, device, dtype):
    # Decode at and one past a boundary, a fresh prefill, a chunk after a cached prefix, a 1-token sequence.
    b = 8
    case = make_case(q_lens=[1, 1, 9, 5, 1], seq_lens=[2 * b, 2 * b + 1, 9, 3 * b + 5, 1], num_heads=6,
                     num_kv_heads=2, head_dim=32, block_size=b, dtype=dtype)
    run_and_compare(backend, case, device)


@pytest.mark.parametrize("block_size", [1, 16, 32, 128])
def test_block_sizes_and_several_context_tiles(backend, device, block_size):
    case = make_case(q_lens=[1, 3], seq_lens=[150, 70], block_size=block_size, num_heads=4, num_kv_heads=1)
    run_and_compare(backend, case, device)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_head_dims(backend, device, head_dim):
    case = make_case(q_lens=[2, 1], seq_lens=[20, 9], head_dim=head_dim, num_heads=2, num_kv_heads=1,
                     block_size=8, dtype=torch.float16)
    run_and_compare(backend, case, device)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (8, 1), (32, 1)])
def test_gqa_mqa_groups(backend, device, num_heads, num_kv_heads):
    case = make_case(q_lens=[4, 1], seq_lens=[11, 17], num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=16, block_size=8)
    run_and_compare(backend, case, device)


@pytest.mark.parametrize("window", [1, 5, 40])
def test_sliding_window(backend, device, window):
    case = make_case(q_lens=[20, 1, 3], seq_lens=[20, 90, 33], block_size=8)
    run_and_compare(backend, case, device, sliding_window=window)


def test_shared_and_out_of_order_blocks(backend, device):
    case = make_case(q_lens=[1, 2, 1], seq_lens=[33, 30, 17], block_size=8, shared_prefix_blocks=2)
    assert case.block_tables[1, 1] == case.block_tables[0, 1]
    run_and_compare(backend, case, device)


def test_empty_batch_and_sequences_without_new_tokens(backend, device):
    run_and_compare(backend, make_case(q_lens=[0, 3, 0], seq_lens=[9, 12, 4], block_size=8), device)
    empty = make_case(q_lens=[], seq_lens=[], block_size=8).to(device)
    assert backend.paged_attention(empty.query, empty.key_cache, empty.value_cache, **empty.kwargs()).shape == (0, 4, 16)


def test_per_layer_view_of_a_shared_pool(backend, device):
    # The engine may allocate one pool [layers, 2, blocks, ...] and hand out strided views.
    case = make_case(q_lens=[3, 1], seq_lens=[19, 8], block_size=8).to(device)
    pool = torch.zeros(3, 2, *case.key_cache.shape, device=device)
    pool[1, 0], pool[1, 1] = case.key_cache, case.value_cache
    case.key_cache, case.value_cache = pool[1, 0], pool[1, 1]
    run_and_compare(backend, case, device)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # stateless
@given(data=st.data(), block_size=st.sampled_from([1, 8, 16]), dtype=st.sampled_from([torch.float32, torch.float16]),
       window=st.one_of(st.none(), st.integers(1, 30)))
def test_random_batches(backend, device, data, block_size, dtype, window):
    num_seqs = data.draw(st.integers(1, 4))
    seq_lens = data.draw(st.lists(st.integers(1, 70), min_size=num_seqs, max_size=num_seqs))
    q_lens = [data.draw(st.integers(0, min(s, 12))) for s in seq_lens]
    case = make_case(q_lens=q_lens, seq_lens=seq_lens, block_size=block_size, dtype=dtype,
                     num_heads=4, num_kv_heads=2, seed=data.draw(st.integers(0, 999)))
    run_and_compare(backend, case, device, sliding_window=window)


def test_reshape_and_cache_matches_twin(backend, device):
    gen = torch.Generator().manual_seed(3)
    key, value = torch.randn(7, 2, 24, generator=gen), torch.randn(7, 2, 24, generator=gen)
    slots = torch.tensor([17, -1, 0, 31, 8, -1, 9])  # pool of 4 blocks x 8 slots
    caches = [torch.zeros(4, 8, 2, 24) for _ in range(2)]
    expected = [c.clone() for c in caches]
    reference.reshape_and_cache_ref(key, value, *expected, slots)
    moved = [t.to(device) for t in (key, value, *caches, slots)]
    backend.reshape_and_cache(*moved)
    assert torch.equal(moved[2].cpu(), expected[0]) and torch.equal(moved[3].cpu(), expected[1])
    assert moved[2].abs().sum() > 0


def test_copy_blocks_matches_twin(backend, device):
    gen = torch.Generator().manual_seed(4)
    layers = [[torch.randn(6, 8, 2, 16, generator=gen) for _ in range(2)] for _ in range(3)]
    mapping = torch.tensor([[0, 5], [3, 1]])
    expected = [[c.clone() for c in layer] for layer in layers]
    reference.copy_blocks_ref([k for k, _ in expected], [v for _, v in expected], mapping)
    on_device = [[c.clone().to(device) for c in layer] for layer in layers]
    backend.copy_blocks([k for k, _ in on_device], [v for _, v in on_device], mapping.to(device))
    for got, want in zip(on_device, expected):
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    assert not torch.equal(expected[0][0][5], layers[0][0][5])  # the copy changed something


def test_int64_index_tensors(backend, device):
    # The interface says int32; int64 (torch's default) is accepted too and must give the same answer.
    case = make_case(q_lens=[2, 1], seq_lens=[21, 40], block_size=8)
    case.cu_seqlens_q, case.seq_lens, case.block_tables = (
        case.cu_seqlens_q.long(), case.seq_lens.long(), case.block_tables.long())
    run_and_compare(backend, case, device)
