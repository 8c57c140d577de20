"""The fast CPU path (paged_kernels.sdpa) on the branches the shared parity suite does not force:
several length buckets in one batch, query chunking of long prefills, padding table entries,
and how the backend is chosen. Every answer is held to the twin and to dense attention."""

from __future__ import annotations

import pytest
import torch
from paged_attention_cases import PAD_BLOCK, TOLERANCE, dense_attention, make_case

from paged_kernels import TorchBackend, TorchReferenceBackend, get_backend, reference, sdpa

torch.set_num_threads(1)


def check(case, *, sliding_window=None):
    out = get_backend("torch").paged_attention(case.query, case.key_cache, case.value_cache,
                                               **case.kwargs(sliding_window=sliding_window))
    twin = reference.paged_attention_ref(case.query, case.key_cache, case.value_cache,
                                         **case.kwargs(sliding_window=sliding_window))
    tol = TOLERANCE[case.query.dtype]
    assert out.dtype == case.query.dtype and not out.isnan().any()
    torch.testing.assert_close(out, twin, atol=tol, rtol=tol)
    torch.testing.assert_close(out.double(), dense_attention(case, sliding_window=sliding_window), atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [None, 6])
def test_decodes_and_chunks_across_many_buckets(window):
    # Decode contexts of 1..25 blocks and chunks of 2..33 queries land in different power-of-two
    # buckets; each bucket pads only to its own longest member.
    seq_lens = [1, 4, 5, 9, 17, 40, 100, 7, 30, 33, 80]
    q_lens = [1, 1, 1, 1, 1, 1, 1, 2, 5, 33, 17]
    case = make_case(q_lens=q_lens, seq_lens=seq_lens, block_size=4, num_heads=6, num_kv_heads=2)
    sizes = torch.where(torch.tensor(q_lens) == 1, (torch.tensor(seq_lens) + 3) // 4, torch.tensor(q_lens))
    assert len(set(sdpa._ceil_log2(sizes).tolist())) >= 5  # the case really spans buckets
    check(case, sliding_window=window)


@pytest.mark.parametrize("window", [None, 6])
def test_whole_prompts_of_unequal_lengths_and_a_bucket_mixed_with_a_later_chunk(window):
    # bucket 32: four whole prompts of 17..30 tokens (the mask-free causal path); bucket 16:
    # a whole prompt beside a chunk with earlier context (that bucket needs the mask)
    case = make_case(q_lens=[20, 17, 30, 18, 9, 12], seq_lens=[20, 17, 30, 18, 9, 40],
                     block_size=4, num_heads=6, num_kv_heads=2)
    check(case, sliding_window=window)


def test_long_prefill_in_query_chunks(monkeypatch):
    # A mask budget of 8 query rows x 48 context positions forces several passes.
    monkeypatch.setattr(sdpa, "MASK_BUDGET_BYTES", 8 * 48)
    case = make_case(q_lens=[40, 11], seq_lens=[40, 44], block_size=8)
    check(case, sliding_window=None)
    check(case, sliding_window=5)


def test_padding_table_entries_are_never_read():
    # make_case pads tables with PAD_BLOCK (far outside the pool): an index_select of it would raise.
    case = make_case(q_lens=[1, 3], seq_lens=[3, 29], block_size=8)
    assert int(case.block_tables[0, 1]) == PAD_BLOCK
    check(case)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_caches_widen_to_fp32(dtype):
    case = make_case(q_lens=[1, 6, 1], seq_lens=[70, 6, 18], block_size=16, dtype=dtype)
    check(case)


def test_backend_names(monkeypatch):
    monkeypatch.delenv("PAGED_ATTENTION_BACKEND", raising=False)
    fast = get_backend(device="cpu")
    assert fast.name == "torch" and type(fast) is TorchBackend  # the CPU default is the fast path
    monkeypatch.setenv("PAGED_ATTENTION_BACKEND", "torch-reference")
    twin = get_backend(device="cpu")
    assert twin.name == "torch-reference" and isinstance(twin, TorchReferenceBackend)
    assert twin._paged_attention is reference.paged_attention_ref
    assert fast._paged_attention is sdpa.paged_attention_sdpa


def test_reused_gather_buffers_do_not_leak_between_calls():
    # The gather buffers are reused: a bigger batch after a small one grows them, a smaller one
    # after reads only its own prefix; earlier outputs never alias them.
    backend = get_backend("torch")
    small = make_case(q_lens=[1, 2], seq_lens=[9, 6], block_size=4, seed=1)
    big = make_case(q_lens=[1, 1, 7], seq_lens=[60, 33, 50], block_size=4, seed=2)
    first = backend.paged_attention(small.query, small.key_cache, small.value_cache, **small.kwargs())
    kept = first.clone()
    check(big)
    again = backend.paged_attention(small.query, small.key_cache, small.value_cache, **small.kwargs())
    assert torch.equal(first, kept) and torch.equal(again, first)
    check(small)


def test_buffers_made_in_inference_mode_serve_calls_outside_it():
    # The engine runs under torch.inference_mode; tests and tools call the backend outside it.
    case = make_case(q_lens=[1, 1], seq_lens=[300, 7], block_size=16, seed=5)  # grows the buffers
    with torch.inference_mode():
        check(case)
    check(case)
    with torch.inference_mode():
        check(case)


def test_one_plan_per_step_serves_every_layer_and_a_new_step_gets_its_own():
    # The engine passes the same metadata tensors to every layer of a step: the buckets and
    # masks are built once (the cached plan is the same object) while each layer's own cache
    # is read; the next step's new tensors (other lengths) get a new plan.
    layer0 = make_case(q_lens=[1, 5, 1], seq_lens=[30, 5, 9], block_size=4, seed=3)
    layer1 = make_case(q_lens=[1, 5, 1], seq_lens=[30, 5, 9], block_size=4, seed=4)
    meta = layer0.kwargs()
    backend = get_backend("torch")
    outs = []
    for layer in (layer0, layer1):
        outs.append(backend.paged_attention(layer.query, layer.key_cache, layer.value_cache, **meta))
        plan = sdpa._plans.last[2]
        if layer is layer0:
            first_plan = plan
    assert plan is first_plan
    for layer, out in zip((layer0, layer1), outs):  # layer1's cache read with the step's tables
        twin = reference.paged_attention_ref(layer.query, layer.key_cache, layer.value_cache, **meta)
        torch.testing.assert_close(out, twin, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(outs[0], outs[1])
    nxt = make_case(q_lens=[1, 1, 1], seq_lens=[31, 6, 10], block_size=4, seed=5)
    check(nxt)
    assert sdpa._plans.last[2] is not first_plan
    # any one of the three tensors new (here the same cu_seqlens_q object): a new plan
    other = make_case(q_lens=[1, 5, 1], seq_lens=[12, 5, 20], block_size=4, seed=6)
    mixed = dict(other.kwargs(), cu_seqlens_q=layer0.cu_seqlens_q)
    backend.paged_attention(layer0.query, layer0.key_cache, layer0.value_cache, **meta)
    out = backend.paged_attention(other.query, other.key_cache, other.value_cache, **mixed)
    torch.testing.assert_close(out, reference.paged_attention_ref(
        other.query, other.key_cache, other.value_cache, **mixed), atol=1e-5, rtol=1e-5)
    # a sliding window shapes the masks: the same tensors with a window get their own plan
    check(layer0, sliding_window=3)
    check(layer0)


def _write(slots, caches, gen):
    key, value = (torch.randn(slots.shape[0], 2, 8, generator=gen) for _ in range(2))
    expected = [c.clone() for c in caches]
    reference.reshape_and_cache_ref(key, value, *expected, slots)
    get_backend("torch").reshape_and_cache(key, value, *caches, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_the_cache_write_plans_once_per_slot_tensor_and_sees_in_place_changes():
    """Every layer of a step writes through the same slot_mapping: its plan (rows, slots) is
    reused by every layer and redone for a new tensor, or after the tensor changed in place."""
    gen = torch.Generator().manual_seed(5)
    layers = [[torch.zeros(4, 4, 2, 8) for _ in range(2)] for _ in range(2)]
    slots = torch.tensor([3, 15, 0, 9])            # no negative slot: no row is dropped
    for caches in layers:                           # two layers, one step
        _write(slots, caches, gen)
    assert sdpa._writes.last[2][0] is None          # all rows kept, the tensor's slots
    slots[1] = -1                                   # changed in place: a new plan
    _write(slots, layers[0], gen)
    assert sdpa._writes.last[2][0].tolist() == [0, 2, 3]
    _write(torch.tensor([1, -1, 2, 7]), layers[1], gen)   # a new step's tensor
    assert sdpa._writes.last[2][1].tolist() == [1, 2, 7]
