"""Shared fixtures: tiny checkpoints of each supported family, and the block-leak guard."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch (OpenMP) thread per test process and per server it starts: pytest -n 2 already
# runs two workers on CI's two cores, and OpenMP workers that spin while another process
# holds their core stall an engine step by seconds (README.md, "CPU threads").
# Must be set before torch is first imported; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def no_kv_block_leaks(monkeypatch):
    """After every test, every engine it built must hold no blocks for finished work:
    each block free or cached, every ref count zero, bookkeeping consistent."""
    from engine.llm_engine import LLMEngine

    engines: list[LLMEngine] = []
    original = LLMEngine.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(LLMEngine, "__init__", tracking_init)
    yield engines
    for engine in engines:
        engine.check_no_leaks()
        if not engine.has_unfinished_requests():
            stats = engine.kv.stats()
            assert stats.num_used == 0, f"{stats.num_used} KV blocks leaked"
            assert all(b.ref_count == 0 for b in engine.kv.blocks)


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
