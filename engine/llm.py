"""Offline batch API: `LLM(model=...).generate(prompts, sampling_params)`, as in vLLM."""
from __future__ import annotations

import itertools
from collections.abc import Sequence as SequenceABC

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

PromptType = str | dict


class LLM:
    def __init__(self, model: str | None = None, **kwargs) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: PromptType | SequenceABC[PromptType],
                 sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None, *,
                 use_tqdm: bool | None = None, priority: SequenceABC[int] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of `prompts`.

        A prompt is a string or {"prompt_token_ids": [...]} (optionally with "cache_salt").
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts; "
                             "pass one SamplingParams or one per prompt")
        engine = self.llm_engine
        order: dict[str, int] = {}
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                request_id = str(next(self._ids))
                if isinstance(prompt, dict):
                    if "prompt_token_ids" not in prompt:
                        raise ValueError("a dict prompt needs 'prompt_token_ids'")
                    engine.add_request(request_id, list(prompt["prompt_token_ids"]), p,
                                       cache_salt=prompt.get("cache_salt"),
                                       priority=priority[i] if priority else 0)
                elif isinstance(prompt, str):
                    engine.add_request(request_id, prompt, p,
                                       priority=priority[i] if priority else 0)
                else:
                    raise ValueError(f"prompt {i} is a {type(prompt).__name__}; pass a string or "
                                     "{'prompt_token_ids': [...]}")
                order[request_id] = i
            return self._run(order, use_tqdm if use_tqdm is not None else len(prompts) >= 32)
        except BaseException:
            for request_id in order:  # lose nothing: no request keeps blocks after an error
                engine.abort_request(request_id)
            raise

    def _run(self, order: dict[str, int], use_tqdm: bool) -> list[RequestOutput]:
        from tqdm.auto import tqdm

        results: list[RequestOutput | None] = [None] * len(order)
        bar = tqdm(total=len(order), desc="Processed prompts", disable=not use_tqdm)
        while self.llm_engine.has_unfinished_requests():
            for out in self.llm_engine.step():
                if out.finished and out.request_id in order:
                    results[order[out.request_id]] = out
                    bar.update(1)
        bar.close()
        return [r for r in results if r is not None]
