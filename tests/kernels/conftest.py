"""Kernel-test set-up: every attention backend runs the same suite.

Without CUDA the Triton kernels run under the Triton interpreter on CPU. The interpreter is
chosen when a kernel is decorated (when paged_kernels.triton_* is first imported), so the variable
is set here, at collection, before any test imports them; each xdist worker collects this
conftest itself, so the setting holds there too.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    for _name in ("paged_kernels.triton_attention", "paged_kernels.triton_cache"):
        if _name in sys.modules:  # decorated already: compiled (unusable on CPU) unless interpreted
            from triton.runtime.jit import JITFunction

            if any(isinstance(v, JITFunction) for v in vars(sys.modules[_name]).values()):
                raise pytest.UsageError(
                    f"{_name} was imported before tests/kernels/conftest.py set TRITON_INTERPRET=1; "
                    f"import the Triton kernel modules lazily (paged_kernels.get_backend does), not at module level"
                )

BACKENDS = ("torch", "torch-reference", "triton")


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(params=BACKENDS)
def backend(request, device):
    from paged_kernels import get_backend

    return get_backend(request.param, device=device)
