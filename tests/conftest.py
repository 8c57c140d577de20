"""Shared fixtures: tiny checkpoints of each supported family, and the block-leak guard."""
from __future__ import annotations

import os
import weakref

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch (OpenMP) thread per test process and per server it starts: pytest -n 2 already
# runs two workers on CI's two cores, and OpenMP workers that spin while another process
# holds their core stall an engine step by seconds (README.md, "CPU threads").
# Must be set before torch is first imported; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Without CUDA the Triton kernels run under Triton's interpreter (tests/kernels/conftest.py).
# Triton reads TRITON_INTERPRET when triton.language and the kernels are decorated, and
# importing the engine imports triton.language, so it is set here, before any test module
# is collected: set only by tests/kernels/conftest.py, a module of tests/engine that
# imported the engine at collection made every interpreted kernel fail ("Cannot call
# @triton.jit'd outside of the scope of a kernel") in a run of the whole suite.
import torch  # noqa: E402  (after OMP_NUM_THREADS)

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# The operator's resync period is the interval of a kopf.timer, read from the environment
# when paged_operator is imported. tests/operator runs the operator in this process and
# needs a short one, so it is imported here, before any test module can import it, with
# the variable set for the import only: operators started as subprocesses (the local
# cluster's) keep the default.
if "PAGED_OPERATOR_RESYNC_SECONDS" not in os.environ:
    os.environ["PAGED_OPERATOR_RESYNC_SECONDS"] = "0.3"
    try:
        import paged_operator  # noqa: F401,E402
    finally:
        del os.environ["PAGED_OPERATOR_RESYNC_SECONDS"]


_ENGINES: "weakref.WeakSet" = weakref.WeakSet()


@pytest.fixture(scope="session", autouse=True)
def _track_engines():
    """Every LLMEngine built in this session, whatever the scope of the fixture that built
    it (session and module fixtures are set up before any function-scoped patch could see
    them)."""
    from engine.llm_engine import LLMEngine

    original = LLMEngine.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _ENGINES.add(self)

    LLMEngine.__init__ = tracking_init
    yield _ENGINES
    LLMEngine.__init__ = original


@pytest.fixture(autouse=True)
def no_kv_block_leaks(_track_engines):
    """After every test, every live engine (this test's and longer-lived fixtures') must hold
    no blocks for finished work: each block free or cached, every ref count zero, bookkeeping
    consistent. Checked under the engine's lock, so at a step boundary even when a server
    thread drives it; an engine still busy after 10 s is checked after a later test."""
    yield
    for engine in list(_track_engines):
        if not engine.lock.acquire(timeout=10):
            continue
        try:
            engine.check_no_leaks()
            if not engine.has_unfinished_requests():
                stats = engine.kv.stats()
                assert stats.num_used == 0, f"{stats.num_used} KV blocks leaked"
                assert all(b.ref_count == 0 for b in engine.kv.blocks)
        except AssertionError:
            _track_engines.discard(engine)  # reported once, not after every later test
            raise
        finally:
            engine.lock.release()


_FAMILIES = {
    "llama": {},
    "qwen2": {},
    # a short window so the parity tests exercise sliding-window attention
    "mistral": {"sliding_window": 24},
}


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Small random-weight GQA checkpoints (fixed seed) of each family, built once."""
    from engine.default_model import build_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for family, extra in _FAMILIES.items():
        paths[family] = str(build_checkpoint(
            root / family, architecture=family, hidden_size=64, num_layers=2, num_heads=4,
            num_kv_heads=2, intermediate_size=128, max_position_embeddings=256, seed=1,
            extra_config=extra))
    return paths
