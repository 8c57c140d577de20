"""PagedAttention inference engine with vLLM's user-facing names."""
from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import EngineStats, LLMEngine
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "EngineStats", "SamplingParams",
           "RequestOutput", "CompletionOutput", "RequestMetrics"]
