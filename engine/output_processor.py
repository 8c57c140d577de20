"""Sampled tokens → request state and outputs: detokenize, check stops, build RequestOutputs.

One `RequestState` per request holds its sequences (n samples) and their detokenizers; the
engine owns the table of them. Retiring a sequence goes through the scheduler, which frees
its blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.config import RuntimeInfo
from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.structured_output.manager import StructuredOutputManager

if TYPE_CHECKING:  # the sampler imports torch; this module need not
    from engine.sampler import Sampler

MAX_ERROR_CHARS = 300


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)
    detoks: dict[int, IncrementalDetokenizer] = field(default_factory=dict)
    prompt_logprobs: list[dict[int, float] | None] | None = None  # filled chunk by chunk


class OutputProcessor:
    def __init__(self, tokenizer, info: RuntimeInfo, scheduler: Scheduler,
                 sampler: Sampler) -> None:
        self.tokenizer = tokenizer
        self.info = info
        self.scheduler = scheduler
        self.sampler = sampler
        self.generation_tokens_total = 0
        # grammars and matchers of structured requests (xgrammar loads on first use)
        self.structured = StructuredOutputManager(
            tokenizer, vocab_size=info.vocab_size, eos_token_ids=info.eos_token_ids)
        sampler.structured = self.structured

    def add_seq(self, req: RequestState, seq: Sequence) -> None:
        p = req.params
        if p.structured_outputs is not None and not req.seqs:
            self.structured.compile(p.structured_outputs)  # ValueError if invalid; cached
        req.seqs.append(seq)
        req.detoks[seq.index] = IncrementalDetokenizer(
            self.tokenizer, skip_special_tokens=p.skip_special_tokens, stop=p.stop_list,
            include_stop_str_in_output=p.include_stop_str_in_output)

    @staticmethod
    def add_prompt_logprobs(req: RequestState, seq: Sequence, start: int,
                            entries: list[dict[int, float]]) -> None:
        """Entries for prompt tokens start+1, start+2, ...; positions already held (a chunk
        computed again after a preemption) are kept. The last one ends the prompt's need for
        logits (and lets later recomputes read the prefix cache)."""
        held = req.prompt_logprobs
        assert held is not None
        for position, entry in enumerate(entries, start + 1):
            if position == len(held):
                held.append(entry)
        if len(held) >= seq.num_prompt_tokens:
            seq.wants_prompt_logits = False

    def retire(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        self.sampler.forget(seq)
        self.structured.forget(seq)

    def append_token(self, req: RequestState, seq: Sequence, token: int, logprob: float,
                     top: dict[int, float] | None, now: float) -> None:
        m = req.metrics
        m.first_token_time = m.first_token_time or now
        m.last_token_time = now
        self.structured.accept(seq, token)  # before the append: a new matcher replays output
        seq.token_ids.append(token)
        seq.cumulative_logprob += logprob
        if seq.logprobs is not None:
            seq.logprobs.append(top or {token: logprob})
        self.generation_tokens_total += 1
        p = seq.params
        detok = req.detoks[seq.index]
        reason = None
        if token in p.stop_token_ids:  # the sampler banned these until min_tokens
            reason, seq.stop_reason = "stop", token
        elif not p.ignore_eos and token in self.info.eos_token_ids:
            reason = "stop"
        elif p.detokenize:
            stop_str = detok.add(token)
            if stop_str is not None:
                reason, seq.stop_reason = "stop", stop_str
        if reason is None:
            max_tokens = p.max_tokens or self.info.max_model_len
            if seq.num_output_tokens >= max_tokens or seq.num_tokens >= self.info.max_model_len:
                reason = "length"
        if reason is not None:
            detok.flush()
            self.retire(seq, reason)
            if all(s.is_finished for s in req.seqs) and len(req.seqs) == p.n:
                m.finished_time = now

    @staticmethod
    def _returned(req: RequestState) -> list[Sequence]:
        """The samples an output shows: all n, or with best_of the output_n of highest
        cumulative logprob once all finished (before that, the first output_n)."""
        if len(req.seqs) == 1:   # n = 1: every request but parallel sampling's
            return req.seqs
        seqs = sorted(req.seqs, key=lambda s: s.index)
        p = req.params
        if p.output_n == p.n:
            return seqs
        if req.metrics.finished_time is None:
            return seqs[:p.output_n]
        best = sorted(seqs, key=lambda s: (-s.cumulative_logprob, s.index))
        return best[:p.output_n]

    def make_output(self, req: RequestState) -> RequestOutput:
        outs = []
        for index, seq in enumerate(self._returned(req)):
            detok = req.detoks[seq.index]
            outs.append(CompletionOutput(
                index=index, text=detok.text, token_ids=seq.output_token_ids,   # a fresh slice
                cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
                logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs,
                             req.metrics.finished_time is not None, req.metrics,
                             num_cached_tokens=req.seqs[0].num_cached_tokens,
                             priority=req.priority, prompt_logprobs=req.prompt_logprobs)

    def fail(self, req: RequestState, exc: BaseException, now: float) -> RequestOutput:
        """Finish a request whose work raised: every unfinished sample ends with "error" and
        gives its blocks back; the output carries a short message in `error`."""
        for seq in req.seqs:
            if not seq.is_finished:
                self.retire(seq, "error")
        req.metrics.finished_time = now
        outs = []
        for seq in sorted(req.seqs, key=lambda s: s.index):
            try:  # the detokenizer itself may be what raised
                text = req.detoks[seq.index].text
            except Exception:  # noqa: BLE001 - the request is already failing
                text = ""
            outs.append(CompletionOutput(index=seq.index, text=text,
                                         token_ids=seq.output_token_ids,   # a fresh slice
                                         finish_reason=seq.finish_reason))
        message = f"{type(exc).__name__}: {exc}"
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS - 3] + "..."
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, True,
                             req.metrics, num_cached_tokens=req.seqs[0].num_cached_tokens,
                             priority=req.priority, error=message)
