"""Per-request sampling settings, under vLLM's names."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.structured_output.params import StructuredOutputsParams

# What torch.Generator.manual_seed takes; sample i of a request uses seed + i, so
# seed + n - 1 must stay inside it too.
SEED_MIN, SEED_MAX = -2**63, 2**64 - 1
_MIN_TEMPERATURE = 1e-2


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> None:
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")


def _check_float(name: str, value, *, low: float | None = None,
                 high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")


@dataclass(kw_only=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    # Log-probabilities of the prompt's tokens (each position given the ones before it),
    # with this many alternatives; the first position has none (None in the list).
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    # False: no text at all (outputs carry token ids; text is ""), as vLLM's; for callers
    # that read only the ids (the simulator, tuner/sim), it saves the per-token decode
    detokenize: bool = True
    # token id -> bias added to its logit before every other processor (OpenAI's range)
    logit_bias: dict[int, float] | None = None
    # Sample best_of sequences, return the n with the highest cumulative logprob. As in
    # vLLM, `n` then holds best_of (what the engine samples) and `output_n` the n returned.
    best_of: int | None = None
    structured_outputs: "StructuredOutputsParams | None" = None
    stop_list: list[str] = field(init=False, repr=False)
    output_n: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_int("n", self.n, low=1)
        self.output_n = self.n
        if self.best_of is not None:
            _check_int("best_of", self.best_of, low=1)
            if self.best_of < self.n:
                raise ValueError(f"best_of must be >= n, got best_of={self.best_of}, n={self.n}")
            self.n = self.best_of
        if isinstance(self.structured_outputs, dict):
            from engine.structured_output.params import StructuredOutputsParams

            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.logit_bias:
            self.logit_bias = dict(self.logit_bias)
            for token, bias in self.logit_bias.items():
                if not _is_int(token) or token < 0:
                    raise ValueError(f"logit_bias keys must be token ids (integers >= 0), "
                                     f"got {token!r}")
                _check_float("logit_bias", bias, low=-100.0, high=100.0)
        _check_float("temperature", self.temperature, low=0.0)
        if 0.0 < self.temperature < _MIN_TEMPERATURE:  # as vLLM: 1/T would overflow the logits
            self.temperature = _MIN_TEMPERATURE
        _check_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is None:
            self.top_k = -1
        # any size: values >= the vocabulary mean "off" (the sampler clamps), as in vLLM
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or a positive integer, got {self.top_k!r}")
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        if self.seed is not None:
            _check_int("seed", self.seed, low=SEED_MIN, high=SEED_MAX)
            if self.seed + self.n - 1 > SEED_MAX:  # sample i draws with seed + i
                raise ValueError(f"seed + n - 1 must be <= {SEED_MAX} (sample i is seeded with "
                                 f"seed + i); got seed={self.seed}, n={self.n}")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0, high=20)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, low=0, high=20)
        _check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _check_float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if isinstance(self.stop, str):
            self.stop_list = [self.stop]
        else:
            self.stop_list = [s for s in (self.stop or [])]
        if any(not isinstance(s, str) or not s for s in self.stop_list):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        if self.stop_list and not self.detokenize:
            raise ValueError("stop strings are matched in the text: set detokenize=True to use "
                             "stop, or stop on token ids (stop_token_ids)")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), "
                             f"got {self.stop_token_ids!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)
