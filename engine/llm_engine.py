"""The step loop: scheduler → model runner → sampler → detokenizer → outputs."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from engine.config import EngineConfig, RuntimeInfo
from engine.detokenizer import IncrementalDetokenizer
from engine.kv_cache_manager import KVCacheManager
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence


@dataclass
class EngineStats:
    num_requests_running: int
    num_requests_waiting: int
    num_seqs_running: int
    num_seqs_waiting: int
    kv_cache_usage: float  # used blocks / all blocks
    num_blocks: int
    block_size: int
    num_free_blocks: int
    num_cached_blocks: int
    num_used_blocks: int
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    num_preemptions: int
    cow_copies: int
    evictions: int
    prompt_tokens: int
    generation_tokens: int


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)
    detoks: dict[int, IncrementalDetokenizer] = field(default_factory=dict)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoTokenizer

        from engine.model_loader import resolve_model_path
        from engine.model_runner import ModelRunner
        from engine.sampler import Sampler

        self.config = config
        path = resolve_model_path(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.runner = ModelRunner(config, path)
        text_cfg = self.runner.hf_config.get_text_config()
        model_max = getattr(text_cfg, "max_position_embeddings", None) or 2048
        max_model_len = config.max_model_len or model_max
        if max_model_len > model_max:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's "
                             f"max_position_embeddings={model_max}; lower max_model_len")
        num_blocks = self.runner.determine_num_blocks(max_model_len)
        needed = -(-max_model_len // config.block_size)
        if num_blocks < needed:
            raise ValueError(
                f"the KV pool has {num_blocks} blocks of {config.block_size} tokens but one "
                f"max_model_len={max_model_len} sequence needs {needed}; raise "
                "num_gpu_blocks_override / gpu_memory_utilization or lower max_model_len")
        self.runner.allocate_kv_cache(num_blocks)
        eos = self.runner.model.generation_config.eos_token_id
        eos = {eos} if isinstance(eos, int) else set(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.info = RuntimeInfo(
            model_path=str(path), model_name=config.served_model_name or path.name,
            max_model_len=max_model_len, num_blocks=num_blocks, block_size=config.block_size,
            eos_token_ids=frozenset(eos), vocab_size=self.runner.vocab_size,
            kv_bytes_per_block=self.runner.kv_bytes_per_block, device=str(self.runner.device),
            dtype=str(self.runner.dtype).removeprefix("torch."),
            attention_backend=self.runner.backend.name)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   policy=config.scheduling_policy)
        self.sampler = Sampler(eos_token_ids=self.info.eos_token_ids, seed=config.seed,
                               device=self.runner.device)
        self._requests: dict[str, _Request] = {}
        self._arrivals = itertools.count()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    @classmethod
    def from_args(cls, **kwargs) -> "LLMEngine":
        return cls(EngineConfig(**kwargs))

    @property
    def model_name(self) -> str:
        return self.info.model_name

    @property
    def num_blocks(self) -> int:
        return self.info.num_blocks

    # ---- requests ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None) -> None:
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            text, ids = None, list(prompt)
            if any(not isinstance(t, int) or not 0 <= t < self.info.vocab_size for t in ids):
                raise ValueError(f"prompt_token_ids must be integers in [0, {self.info.vocab_size})")
        if not ids:
            raise ValueError("the prompt is empty; send at least one token")
        max_len = self.info.max_model_len
        if len(ids) >= max_len:
            raise ValueError(f"the prompt has {len(ids)} tokens but max_model_len is {max_len}; "
                             "shorten the prompt or raise max_model_len")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.config.max_num_seqs}")
        req = _Request(request_id, text, ids, params, priority,
                       RequestMetrics(arrival_time or time.monotonic()))
        seq = Sequence(request_id=request_id, token_ids=list(ids), num_prompt_tokens=len(ids),
                       params=params, priority=priority, arrival_order=next(self._arrivals),
                       cache_salt=cache_salt, logprobs=[] if params.logprobs is not None else None)
        self._add_seq(req, seq)
        self._requests[request_id] = req
        self.scheduler.add(seq)
        self.prompt_tokens_total += len(ids)

    def _add_seq(self, req: _Request, seq: Sequence) -> None:
        p = req.params
        req.seqs.append(seq)
        req.detoks[seq.index] = IncrementalDetokenizer(
            self.tokenizer, skip_special_tokens=p.skip_special_tokens, stop=p.stop_list,
            include_stop_str_in_output=p.include_stop_str_in_output)

    def abort_request(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                self.sampler.forget(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        now = time.monotonic()
        for seq in batch.seqs:
            m = self._requests[seq.request_id].metrics
            m.first_scheduled_time = m.first_scheduled_time or now
        logits, rows = self.runner.execute(batch)
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.kv.cache_full_blocks(seq, n)
        sample_seqs, sample_rows = [], []
        for row, i in enumerate(rows):
            seq = batch.seqs[i]
            for s in self._fork_if_needed(seq):
                sample_seqs.append(s)
                sample_rows.append(row)
        touched: dict[str, _Request] = {}
        if sample_seqs:
            result = self.sampler(logits[sample_rows], sample_seqs)
            now = time.monotonic()
            for j, seq in enumerate(sample_seqs):
                req = self._requests[seq.request_id]
                touched[req.request_id] = req
                self._append_token(req, seq, result.token_ids[j], result.logprobs[j],
                                   result.top_logprobs[j], now)
        return [self._make_output(req) for req in touched.values()]

    def _fork_if_needed(self, seq: Sequence) -> list[Sequence]:
        """At the end of a prompt, an n > 1 request forks into n samples sharing its blocks."""
        n = seq.params.n
        if n == 1 or seq.has_forked:
            return [seq]
        seq.has_forked = True
        req = self._requests[seq.request_id]
        children = []
        for index in range(1, n):
            child = seq.fork(index)
            self.kv.fork(seq, child)
            self._add_seq(req, child)
            self.scheduler.running.append(child)
            children.append(child)
        return [seq, *children]

    def _append_token(self, req: _Request, seq: Sequence, token: int, logprob: float,
                      top: dict[int, float] | None, now: float) -> None:
        m = req.metrics
        m.first_token_time = m.first_token_time or now
        m.last_token_time = now
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
        else:
            stop_str = detok.add(token)
            if stop_str is not None:
                reason, seq.stop_reason = "stop", stop_str
        if reason is None:
            max_tokens = p.max_tokens or self.info.max_model_len
            if seq.num_output_tokens >= max_tokens or seq.num_tokens >= self.info.max_model_len:
                reason = "length"
        if reason is not None:
            detok.flush()
            self.scheduler.finish(seq, reason)
            self.sampler.forget(seq)
            if all(s.is_finished for s in req.seqs) and len(req.seqs) == p.n:
                m.finished_time = now

    def _make_output(self, req: _Request) -> RequestOutput:
        outs = []
        for seq in sorted(req.seqs, key=lambda s: s.index):
            detok = req.detoks[seq.index]
            outs.append(CompletionOutput(
                index=seq.index, text=detok.text, token_ids=list(seq.output_token_ids),
                cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
                logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
        finished = req.metrics.finished_time is not None
        if finished:
            del self._requests[req.request_id]
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, finished,
                             req.metrics, num_cached_tokens=req.seqs[0].num_cached_tokens,
                             priority=req.priority)

    # ---- statistics -------------------------------------------------------------------------
    def get_stats(self) -> EngineStats:
        kv = self.kv.stats()
        running = {s.request_id for s in self.scheduler.running}
        waiting = {s.request_id for s in self.scheduler.waiting} - running
        return EngineStats(
            num_requests_running=len(running), num_requests_waiting=len(waiting),
            num_seqs_running=len(self.scheduler.running),
            num_seqs_waiting=len(self.scheduler.waiting), kv_cache_usage=kv.usage,
            num_blocks=kv.num_blocks, block_size=self.kv.block_size, num_free_blocks=kv.num_free,
            num_cached_blocks=kv.num_cached, num_used_blocks=kv.num_used,
            prefix_cache_queries=kv.prefix_queries, prefix_cache_hits=kv.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions, cow_copies=kv.cow_copies,
            evictions=kv.evictions, prompt_tokens=self.prompt_tokens_total,
            generation_tokens=self.generation_tokens_total)

    def check_no_leaks(self) -> None:
        """All blocks free or cached and ref counts consistent (tests call this)."""
        self.kv.check_invariants(self.scheduler.live_sequences())
