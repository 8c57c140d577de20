"""Triton-only paths: the split-KV (flash-decoding) launch and its merge kernel, compared with the twin.

The parity suite runs the launch the backend picks; here the number of splits is forced,
including more splits than context tiles (empty splits must drop out of the merge).
"""

from __future__ import annotations

import pytest
import torch
from paged_attention_cases import TOLERANCE, make_case

from paged_kernels import reference

torch.set_num_threads(1)


@pytest.fixture
def triton_attention():
    from paged_kernels import triton_attention

    return triton_attention


@pytest.mark.parametrize("num_splits", [2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_kv_matches_twin(triton_attention, device, num_splits, dtype):
    # Long decode, short decode (fewer tiles than splits), and a prefill chunk.
    case = make_case(q_lens=[1, 1, 6], seq_lens=[300, 5, 140], block_size=16, num_heads=8, num_kv_heads=2,
                     dtype=dtype).to(device)
    out = triton_attention.paged_attention(case.query, case.key_cache, case.value_cache, num_splits=num_splits,
                                           **case.kwargs())
    twin = reference.paged_attention_ref(case.query, case.key_cache, case.value_cache, **case.kwargs())
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, twin, atol=tol, rtol=tol)


def test_split_kv_with_sliding_window(triton_attention, device):
    case = make_case(q_lens=[1, 4], seq_lens=[260, 130], block_size=8).to(device)
    kwargs = case.kwargs(sliding_window=70)
    out = triton_attention.paged_attention(case.query, case.key_cache, case.value_cache, num_splits=4, **kwargs)
    twin = reference.paged_attention_ref(case.query, case.key_cache, case.value_cache, **kwargs)
    torch.testing.assert_close(out, twin, atol=2e-5, rtol=2e-5)


def test_split_choice(triton_attention):
    cpu = torch.device("cpu")
    assert triton_attention._pick_num_splits(cpu, active_programs=4, max_context=32768) == 1
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        assert triton_attention._pick_num_splits(cuda, active_programs=8, max_context=32768) > 1  # few long sequences
        assert triton_attention._pick_num_splits(cuda, active_programs=4096, max_context=32768) == 1  # grid already full
        assert triton_attention._pick_num_splits(cuda, active_programs=8, max_context=256) == 1  # context too short
