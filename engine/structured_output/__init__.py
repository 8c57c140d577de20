"""Structured outputs: token masks from a grammar (xgrammar) for the rows that ask for one.

`StructuredOutputsParams` (vLLM's name; params.py) says what a request's output must match;
`StructuredOutputManager` (manager.py) compiles it once (cached), keeps one matcher per
sequence, masks those rows' logits in the sampler, and advances the matcher with each
accepted token.
"""
from engine.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
