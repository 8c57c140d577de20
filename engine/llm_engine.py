"""The step loop: scheduler → model runner → sampler → detokenizer → outputs."""
from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from typing import Callable

from engine.config import EngineConfig, RuntimeInfo
from engine.batch_execution import execute_batch
from engine.kv_cache_manager import KVCacheManager
from engine.kv_events import make_publisher
from engine.kv_offload import make_offload
from engine.output_processor import OutputProcessor, RequestState
from engine.outputs import EngineStats, RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import Sequence
from engine.spec_decode.proposer import make_proposer
from engine.spec_decode.stats import SpecDecodeStats
from engine.step_shape import StepShape

logger = logging.getLogger(__name__)


def _locked(method):
    """One caller at a time: the engine is driven from one thread, but a test's leak check
    (or a stats reader) may look from another and must see a step boundary."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)
    return wrapper


class LLMEngine:
    def __init__(self, config: EngineConfig, *, runner=None, tokenizer=None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`runner` replaces the model runner (tuner/sim/ passes one that advances a
        virtual `clock` by a profile's step time instead of running the model); it must
        answer what ModelRunner answers. `tokenizer` replaces the checkpoint's."""
        from transformers import AutoTokenizer

        from engine.model_loader import default_served_name, resolve_model_path
        from engine.model_runner import ModelRunner
        from engine.sampler import Sampler

        self.config = config
        self.clock = clock
        path = resolve_model_path(config.model)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        self.runner = runner or ModelRunner(config, path)
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
        served = config.served_model_name or default_served_name(config.model, path)
        self.info = RuntimeInfo(
            model_path=str(path), model_name=served,
            max_model_len=max_model_len, num_blocks=num_blocks, block_size=config.block_size,
            eos_token_ids=frozenset(eos), vocab_size=self.runner.vocab_size,
            kv_bytes_per_block=self.runner.kv_bytes_per_block, device=str(self.runner.device),
            dtype=str(self.runner.dtype).removeprefix("torch."),
            attention_backend=self.runner.backend.name)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        # KV cache events over ZeroMQ (engine/kv_events.py); None when kv_events_config is off
        self.kv_events = make_publisher(config.kv_events_config, self.kv)
        # KV tiers under the pool (engine/kv_offload/); None when they are off
        self.offload = make_offload(config, self.runner, self.kv, str(path))
        spec = config.speculative_config
        self.scheduler = Scheduler(self.kv, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   policy=config.scheduling_policy,
                                   proposer=make_proposer(spec),
                                   max_model_len=max_model_len)
        self.spec_stats = SpecDecodeStats(spec["num_speculative_tokens"] if spec else 0)
        self.sampler = Sampler(eos_token_ids=self.info.eos_token_ids, seed=config.seed,
                               device=self.runner.device)
        self.output = OutputProcessor(self.tokenizer, self.info, self.scheduler, self.sampler)
        self._requests: dict[str, RequestState] = {}
        self._arrivals = itertools.count()
        self.lock = threading.RLock()
        self.prompt_tokens_total = 0
        # called after each step that ran a batch with (its shape, its seconds): the
        # profile's calibration (tuner/sim/) fits step time to the shape from these
        self.step_observer: Callable[[StepShape, float], None] | None = None

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
    @_locked
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None) -> None:
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        vocab = self.info.vocab_size
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            text, ids = None, list(prompt)
            # (map, min and max run in C: a long prompt is checked in microseconds)
            if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= vocab):
                raise ValueError(f"prompt_token_ids must be integers in [0, {vocab})")
        if not ids:
            raise ValueError("the prompt is empty; send at least one token")
        bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"stop_token_ids must be in [0, {vocab}) (the vocabulary); "
                             f"got {bad[:4]}")
        bad = [t for t in (params.logit_bias or {}) if t >= vocab]
        if bad:
            raise ValueError(f"logit_bias keys must be token ids in [0, {vocab}) (the "
                             f"vocabulary); got {bad[:4]}")
        max_len = self.info.max_model_len
        if len(ids) >= max_len:
            raise ValueError(f"the prompt has {len(ids)} tokens but max_model_len is {max_len}; "
                             "shorten the prompt or raise max_model_len")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.config.max_num_seqs}")
        req = RequestState(request_id, text, ids, params, priority,
                           RequestMetrics(arrival_time or self.clock()))
        seq = Sequence(request_id=request_id, token_ids=list(ids), num_prompt_tokens=len(ids),
                       params=params, priority=priority, arrival_order=next(self._arrivals),
                       cache_salt=cache_salt, logprobs=[] if params.logprobs is not None else None)
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]  # the first token has no context
            seq.wants_prompt_logits = len(ids) > 1
        self.output.add_seq(req, seq)
        self._requests[request_id] = req
        self.scheduler.add(seq)
        self.prompt_tokens_total += len(ids)

    @_locked
    def abort_request(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.is_finished:
                self.output.retire(seq, "abort")

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- one step ---------------------------------------------------------------------------
    @_locked
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, and process the outputs of one step.

        A step that raises fails only the requests responsible: the step's work is redone
        one request at a time (nothing is committed before the whole batch succeeded), and
        the requests that still raise alone come out finished with `error` set. Device
        faults (the accelerator itself is broken) still raise.
        """
        started = time.perf_counter()
        batch = self.scheduler.schedule()
        if self.offload is not None:  # evicted blocks copied out, then new loads started
            self.offload.transfer(batch)
        self.last_step_shape = (len(batch.seqs), batch.num_tokens)  # (sequences, tokens)
        if not batch.seqs:
            return []
        now = self.clock()
        for seq in batch.seqs:
            m = self._requests[seq.request_id].metrics
            m.first_scheduled_time = m.first_scheduled_time or now
        snapshot = self.sampler.snapshot(batch.seqs)
        shape = StepShape.of(batch) if self.step_observer is not None else None
        try:
            done = [(batch, execute_batch(self.runner, self.sampler, batch))]
            failed: dict[str, Exception] = {}
        except Exception as exc:  # noqa: BLE001 - isolated below, re-raised if global
            self._raise_if_global(exc)
            logger.warning("a step of %d sequences raised %r; retrying it request by request",
                           len(batch.seqs), exc)
            self.sampler.restore(snapshot)
            done, failed = self._run_each_request(batch)
        outputs = []
        for sub, samples in done:
            outputs += self._commit(sub, samples, failed)
        now = self.clock()
        for request_id, exc in failed.items():
            outputs.append(self._fail(self._requests[request_id], exc, now))
        if self.kv_events is not None:
            self.kv_events.flush()  # this step's stored/removed blocks, without waiting
        if shape is not None:  # the whole step: schedule, model, sampling, outputs
            self.step_observer(shape, time.perf_counter() - started)
        return outputs

    def _run_each_request(self, batch: ScheduledBatch):
        """The failed step again, one request's sequences at a time (in batch order, so a
        copy-on-write copy still precedes the write into its source block)."""
        groups: dict[str, list[int]] = {}
        for i, seq in enumerate(batch.seqs):
            groups.setdefault(seq.request_id, []).append(i)
        done, failed = [], {}
        for request_id, idx in groups.items():
            seqs = [batch.seqs[i] for i in idx]
            owned = {b for s in seqs for b in s.block_table}
            sub = ScheduledBatch(seqs=seqs, num_new_tokens=[batch.num_new_tokens[i] for i in idx],
                                 blocks_to_copy=[c for c in batch.blocks_to_copy if c[1] in owned],
                                 draft_token_ids=[batch.draft_token_ids[i] for i in idx]
                                 if batch.draft_token_ids else [])
            try:
                done.append((sub, execute_batch(self.runner, self.sampler, sub)))
            except Exception as exc:  # noqa: BLE001
                self._raise_if_global(exc)
                logger.exception("request %s failed its step", request_id)
                failed[request_id] = exc
        return done, failed

    def _commit(self, batch: ScheduledBatch, result, failed: dict[str, Exception]
                ) -> list[RequestOutput]:
        """Apply a successful run, one request at a time: a request whose output processing
        raises is failed alone (its partial state goes with its blocks)."""
        samples, prompt_lps, verified = result
        work: dict[str, list] = {}
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            work.setdefault(seq.request_id, [[], []])[0].append((seq, n))
        for sample in samples:
            work[sample[0].request_id][1].append(sample)
        outputs = []
        now = self.clock()
        for request_id, (computed, sampled) in work.items():
            req = self._requests[request_id]
            try:
                for seq, n in computed:
                    if seq.seq_id in prompt_lps:
                        self.output.add_prompt_logprobs(req, seq, seq.num_computed_tokens,
                                                        prompt_lps[seq.seq_id])
                    if seq.seq_id in verified:
                        self._commit_verified(req, seq, verified[seq.seq_id], n, now)
                    else:
                        self.scheduler.advance(seq, n)
                for seq, parent, (token, logprob, top) in sampled:
                    if parent is not None:
                        self.scheduler.fork(parent, seq)
                        self.output.add_seq(req, seq)
                    self.output.append_token(req, seq, token, logprob, top, now)
                if sampled or any(s.seq_id in verified for s, _ in computed):
                    outputs.append(self.output.make_output(req))
                    if req.metrics.finished_time is not None:
                        del self._requests[request_id]
            except Exception as exc:  # noqa: BLE001
                self._raise_if_global(exc)
                logger.exception("request %s failed processing its output", request_id)
                failed[request_id] = exc
        return outputs

    def _commit_verified(self, req: RequestState, seq: Sequence, v, num_new: int,
                         now: float) -> None:
        """A speculative row (spec_decode.verifier.Verified): its last token and each
        accepted draft become computed as the draft is appended (so the prefix cache hashes
        real tokens), up to a stop inside the run; the blocks only rejected drafts reached
        go back."""
        self.scheduler.advance(seq, 1)
        for j, (token, logprob, top) in enumerate(v.tokens):
            self.output.append_token(req, seq, token, logprob, top, now)
            if seq.is_finished:
                break
            if j < v.num_accepted:
                self.scheduler.advance(seq, 1)
        if not seq.is_finished:
            self.scheduler.rollback(seq)
        self.spec_stats.observe(num_new - 1, v.num_accepted)

    def _fail(self, req: RequestState, exc: Exception, now: float) -> RequestOutput:
        self._requests.pop(req.request_id, None)
        return self.output.fail(req, exc, now)

    def _raise_if_global(self, exc: Exception) -> None:
        if self.runner.is_device_fault(exc):
            raise exc

    # ---- statistics -------------------------------------------------------------------------
    def get_stats(self) -> EngineStats:
        kv = self.kv.stats()
        running = {s.request_id for s in self.scheduler.running}
        waiting = {s.request_id for s in self.scheduler.live_sequences()} - running
        return EngineStats(
            num_requests_running=len(running), num_requests_waiting=len(waiting),
            num_seqs_running=len(self.scheduler.running),
            num_seqs_waiting=len(self.scheduler.waiting) + len(self.scheduler.loading),
            kv_cache_usage=kv.usage,
            num_blocks=kv.num_blocks, block_size=self.kv.block_size, num_free_blocks=kv.num_free,
            num_cached_blocks=kv.num_cached, num_used_blocks=kv.num_used,
            prefix_cache_queries=kv.prefix_queries, prefix_cache_hits=kv.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions, cow_copies=kv.cow_copies,
            evictions=kv.evictions, prompt_tokens=self.prompt_tokens_total,
            generation_tokens=self.output.generation_tokens_total,
            spec_num_drafts=self.spec_stats.num_drafts,
            spec_num_draft_tokens=self.spec_stats.num_draft_tokens,
            spec_num_accepted_tokens=self.spec_stats.num_accepted_tokens,
            spec_num_accepted_tokens_per_pos=tuple(self.spec_stats.accepted_per_pos))

    @_locked
    def check_no_leaks(self) -> None:
        """All blocks free or cached and ref counts consistent (tests call this)."""
        self.kv.check_invariants(self.scheduler.live_sequences())
