"""PagedAttention inference engine with vLLM's user-facing names.

The public names load lazily (PEP 562), so `import paged_api.settings` stays torch-free: the
operator image ships api/paged_api/settings.py without torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LLM": "engine.llm", "LLMEngine": "engine.llm_engine", "EngineStats": "engine.outputs",
    "EngineConfig": "engine.config", "SamplingParams": "engine.sampling_params",
    "RequestOutput": "engine.outputs", "CompletionOutput": "engine.outputs",
    "RequestMetrics": "engine.outputs",
}
__all__ = ["LLM", "LLMEngine", "EngineConfig", "EngineStats", "SamplingParams",
           "RequestOutput", "CompletionOutput", "RequestMetrics"]

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine
    from engine.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput
    from engine.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
