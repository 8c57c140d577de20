"""Paged-attention kernels: Triton kernels for CUDA and their plain-torch twins.

It installs as ``paged_kernels`` from the folder kernels/ (as operator/ holds paged_operator):
the name ``kernels`` is Hugging Face's hub-kernels library, which transformers probes for
(tests/kernels/test_kernels_transformers_probe.py). Importing this package never imports
triton; Triton loads only when the triton backend is requested.
"""

from .backend import (BACKEND_ENV, AttentionBackend, TorchBackend, TorchReferenceBackend, TritonBackend,
                      get_backend)

__all__ = ["AttentionBackend", "BACKEND_ENV", "TorchBackend", "TorchReferenceBackend", "TritonBackend", "get_backend"]
