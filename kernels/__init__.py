"""Paged-attention kernels: Triton kernels for CUDA and their plain-torch twins.

Importing this package is cheap and never imports triton (transformers imports a package
named ``kernels`` while probing for the Hugging Face hub-kernels library; see
tests/kernels/test_kernels_transformers_probe.py). Triton loads only when the triton backend
is requested.
"""

from .backend import (BACKEND_ENV, AttentionBackend, TorchBackend, TorchReferenceBackend, TritonBackend,
                      get_backend)

__all__ = ["AttentionBackend", "BACKEND_ENV", "TorchBackend", "TorchReferenceBackend", "TritonBackend", "get_backend"]
