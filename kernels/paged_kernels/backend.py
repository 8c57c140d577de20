"""Attention backends the model runner calls: torch on CPU (a fast SDPA path, and the plain
twin that is the oracle) and the Triton kernels (CUDA).

Both share one front door, :class:`AttentionBackend`, which validates every launch
(paged_kernels.validation) and then hands over to the implementation, so a bad launch fails the
same way on either backend.
"""

from __future__ import annotations

import os

import torch

from . import reference, sdpa, validation

BACKEND_ENV = "PAGED_ATTENTION_BACKEND"
CHECKS_ENV = "PAGED_ATTENTION_CHECKS"
BACKEND_NAMES = ("torch", "torch-reference", "triton")


class AttentionBackend:
    """Validating front of an attention backend; subclasses provide the ``_impl`` methods."""

    name: str = ""

    def __init__(self, *, check_values: bool = True) -> None:
        # Value checks read index tensors on the host (one sync per call); shape/dtype checks always run.
        self.check_values = check_values

    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        """key, value ``[num_tokens, kv_heads, D]`` into their slots; slot < 0 means skip."""
        validation.check_reshape_and_cache(
            key, value, key_cache, value_cache, slot_mapping, check_values=self.check_values
        )
        if key.shape[0]:
            self._reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)

    def paged_attention(
        self, query, key_cache, value_cache, *, cu_seqlens_q, seq_lens, block_tables, scale, sliding_window=None
    ) -> torch.Tensor:
        """Causal attention for a mixed prefill/decode batch; see docs/INTERFACES.md."""
        validation.check_paged_attention(
            query, key_cache, value_cache, cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens,
            block_tables=block_tables, scale=scale, sliding_window=sliding_window, check_values=self.check_values,
        )
        if query.shape[0] == 0:
            return torch.empty_like(query)
        return self._paged_attention(
            query, key_cache, value_cache, cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens,
            block_tables=block_tables, scale=float(scale), sliding_window=sliding_window,
        )

    def copy_blocks(self, key_caches, value_caches, block_mapping) -> None:
        """Copy each (src, dst) block pair in every layer (copy-on-write)."""
        validation.check_copy_blocks(key_caches, value_caches, block_mapping, check_values=self.check_values)
        if block_mapping.shape[0]:
            self._copy_blocks(list(key_caches), list(value_caches), block_mapping)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


class TorchBackend(AttentionBackend):
    """The CPU backend: paged attention as bucketed SDPA calls and the cache write as one
    index_copy_ per cache (paged_kernels.sdpa); block copy is the twin's (one op per layer)."""

    name = "torch"
    _reshape_and_cache = staticmethod(sdpa.reshape_and_cache_slots)
    _paged_attention = staticmethod(sdpa.paged_attention_sdpa)
    _copy_blocks = staticmethod(reference.copy_blocks_ref)


class TorchReferenceBackend(TorchBackend):
    """The plain-torch twins (paged_kernels.reference) throughout: the oracle, selectable to rule
    the fast path out when an answer looks wrong."""

    name = "torch-reference"
    _reshape_and_cache = staticmethod(reference.reshape_and_cache_ref)
    _paged_attention = staticmethod(reference.paged_attention_ref)


class TritonBackend(AttentionBackend):
    """The Triton kernels; imports triton on construction, never at package import."""

    name = "triton"

    def __init__(self, *, check_values: bool = True, num_splits: int | None = None) -> None:
        super().__init__(check_values=check_values)
        try:
            from . import triton_attention, triton_cache
        except ImportError as exc:  # triton missing or broken
            raise ValueError(
                f"the triton attention backend needs triton ({exc}); install it with "
                f"`pip install 'paged-inference[triton]'` or set {BACKEND_ENV}=torch"
            ) from exc
        self._attention = triton_attention
        self._cache = triton_cache
        self.num_splits = num_splits  # None: chosen per launch (split-KV for long, narrow batches)

    def _reshape_and_cache(self, *args) -> None:
        self._cache.reshape_and_cache(*args)

    def _paged_attention(self, query, key_cache, value_cache, **kwargs) -> torch.Tensor:
        return self._attention.paged_attention(query, key_cache, value_cache, num_splits=self.num_splits, **kwargs)

    def _copy_blocks(self, *args) -> None:
        self._cache.copy_blocks(*args)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def get_backend(name: str | None = None, device: torch.device | str = torch.device("cpu")) -> AttentionBackend:
    """The attention backend for ``device``.

    name: "torch" | "torch-reference" | "triton" | None. None reads $PAGED_ATTENTION_BACKEND,
    else picks "triton" on CUDA when triton imports and "torch" otherwise. $PAGED_ATTENTION_CHECKS=0 skips the
    value checks that cost a host sync (shape and dtype checks always run).
    """
    device = torch.device(device)
    if name is None:
        name = os.environ.get(BACKEND_ENV, "").strip().lower() or None
    if name is None:
        name = "triton" if device.type == "cuda" and _triton_importable() else "torch"
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r} (from name= or ${BACKEND_ENV}); choose one of {BACKEND_NAMES}")
    check_values = os.environ.get(CHECKS_ENV, "1").strip().lower() not in ("0", "false", "off", "no")
    if name == "torch":
        return TorchBackend(check_values=check_values)
    if name == "torch-reference":
        return TorchReferenceBackend(check_values=check_values)
    if device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"the triton attention backend runs on CUDA devices, not {device}; use {BACKEND_ENV}=torch "
            f"(or TRITON_INTERPRET=1 to interpret the kernels on CPU, for tests)"
        )
    return TritonBackend(check_values=check_values)
