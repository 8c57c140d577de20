"""Bad launches fail with a ValueError naming the problem, before any kernel runs, on every backend."""

from __future__ import annotations

import pytest
import torch
from paged_attention_cases import make_case

from paged_kernels import TorchBackend, get_backend


@pytest.fixture
def case(device):
    return make_case(q_lens=[3, 1], seq_lens=[10, 5], block_size=4, num_heads=4, num_kv_heads=2).to(device)


def attend(backend, case, **overrides):
    args = dict(query=case.query, key_cache=case.key_cache, value_cache=case.value_cache, **case.kwargs())
    args.update(overrides)
    return backend.paged_attention(**args)


@pytest.mark.parametrize("overrides,message", [
    (lambda c: dict(query=c.query.half()), "query has dtype float16"),
    (lambda c: dict(query=c.query[:, :3]), "not a multiple of the cache's 2 kv heads"),
    (lambda c: dict(query=c.query[..., :8]), "head_dim 8 differs"),
    (lambda c: dict(query=c.query[0]), "query must have 3 dimensions"),
    (lambda c: dict(value_cache=c.value_cache[:-1]), "differs from value_cache shape"),
    (lambda c: dict(value_cache=c.value_cache.double()), "value_cache has dtype float64"),
    (lambda c: dict(key_cache=c.key_cache.int()), "key_cache has dtype int32"),
    (lambda c: dict(cu_seqlens_q=c.cu_seqlens_q.float()), "cu_seqlens_q has dtype float32"),
    (lambda c: dict(cu_seqlens_q=c.cu_seqlens_q[:-1]), r"expected num_seqs \+ 1 = 3"),
    (lambda c: dict(cu_seqlens_q=c.cu_seqlens_q - 1), "must start at 0"),
    (lambda c: dict(seq_lens=torch.tensor([2, 5], dtype=torch.int32, device=c.query.device)), "shorter than"),
    (lambda c: dict(seq_lens=torch.tensor([99, 5], dtype=torch.int32, device=c.query.device)), "has room for"),
    (lambda c: dict(block_tables=c.block_tables[:1]), "one per sequence"),
    (lambda c: dict(block_tables=torch.where(c.block_tables == c.block_tables[0, 1], 999, c.block_tables)),
     "outside the pool"),
    (lambda c: dict(scale=0.0), "scale must be a positive"),
    (lambda c: dict(scale=float("nan")), "scale must be a positive"),
    (lambda c: dict(sliding_window=0), "sliding_window must be None or a positive int"),
], ids=lambda v: v if isinstance(v, str) else "bad")
def test_bad_attention_launch(backend, case, overrides, message):
    with pytest.raises(ValueError, match=message):
        attend(backend, case, **overrides(case))


def test_tensors_on_different_devices_are_named(backend, case):
    with pytest.raises(ValueError, match="seq_lens is on"):
        attend(backend, case, seq_lens=case.seq_lens.to("meta"))


@pytest.mark.parametrize("slots,message", [
    ([0, 1, 48], "slot 48 but the pool has only 48 slots"),
    ([0, 3, 3], "same slot twice"),
])
def test_cache_write_rejects_bad_slots_without_writing(backend, device, slots, message):
    key_cache, value_cache = torch.zeros(12, 4, 2, 8, device=device), torch.zeros(12, 4, 2, 8, device=device)
    key = torch.ones(3, 2, 8, device=device)
    with pytest.raises(ValueError, match=message):
        backend.reshape_and_cache(key, key, key_cache, value_cache, torch.tensor(slots, device=device))
    assert key_cache.abs().sum() == 0 and value_cache.abs().sum() == 0  # nothing ran


@pytest.mark.parametrize("change,message", [
    (lambda k, s: (k[:, :1], s), r"expected \[num_tokens, 2, 8\]"),
    (lambda k, s: (k.half(), s), "key has dtype float16"),
    (lambda k, s: (k, s[:2]), "slot_mapping has 2 entries but key has 3"),
    (lambda k, s: (k, s.float()), "slot_mapping has dtype float32"),
])
def test_cache_write_shape_and_dtype(backend, device, change, message):
    caches = torch.zeros(12, 4, 2, 8, device=device), torch.zeros(12, 4, 2, 8, device=device)
    key, slots = change(torch.ones(3, 2, 8, device=device), torch.tensor([0, 1, 2], device=device))
    with pytest.raises(ValueError, match=message):
        backend.reshape_and_cache(key, key, *caches, slots)


@pytest.mark.parametrize("mapping,message", [
    ([[0, 12]], "outside the pool of 12 blocks"),
    ([[0, 2], [1, 2]], "same destination block twice"),
    ([[0, 2], [2, 3]], "both source and destination"),
    ([[0, 1, 2]], r"expected \[num_pairs, 2\]"),
])
def test_bad_block_copies(backend, device, mapping, message):
    layers = [torch.zeros(12, 4, 2, 8, device=device) for _ in range(4)]
    with pytest.raises(ValueError, match=message):
        backend.copy_blocks(layers[:2], layers[2:], torch.tensor(mapping, device=device))


def test_block_copy_layers_must_agree(backend, device):
    with pytest.raises(ValueError, match="2 key caches but 1 value caches"):
        backend.copy_blocks([torch.zeros(4, 2, 1, 8)] * 2, [torch.zeros(4, 2, 1, 8)], torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="layer 1 has 5 blocks but layer 0 has 4"):
        backend.copy_blocks([torch.zeros(4, 2, 1, 8), torch.zeros(5, 2, 1, 8)],
                            [torch.zeros(4, 2, 1, 8), torch.zeros(5, 2, 1, 8)], torch.tensor([[0, 1]]))


def test_backend_choice(monkeypatch, device):
    monkeypatch.delenv("PAGED_ATTENTION_BACKEND", raising=False)
    assert get_backend().name == "torch"  # CPU default
    assert isinstance(get_backend(device="cpu"), TorchBackend)
    monkeypatch.setenv("PAGED_ATTENTION_BACKEND", "triton")
    assert get_backend(device=device).name == "triton"  # on CPU: interpreted (conftest set TRITON_INTERPRET)
    monkeypatch.delenv("PAGED_ATTENTION_BACKEND")
    if device.type == "cuda":
        assert get_backend(device=device).name == "triton"  # CUDA default
    assert get_backend("torch").name == "torch"  # an explicit name beats the setting
    monkeypatch.setenv("PAGED_ATTENTION_BACKEND", "flash")
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        get_backend()


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="runs on CUDA devices"):
        get_backend("triton", device="cpu")


def test_value_checks_can_be_switched_off(monkeypatch, case):
    monkeypatch.setenv("PAGED_ATTENTION_CHECKS", "0")
    backend = get_backend("torch")
    assert backend.check_values is False
    with pytest.raises(ValueError, match="query has dtype"):  # shape/dtype checks stay on
        attend(backend, case, query=case.query.half())
