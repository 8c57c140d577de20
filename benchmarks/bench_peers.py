"""The peers of `python benchmarks/bench_offline.py`, each loaded once and run many times.

Every peer takes the same requests, `(prompt_token_ids, output_len)`, generates exactly
`output_len` tokens for each (greedy, EOS ignored: the lengths were fixed beforehand) and
returns what it counted; tokens/s counts generated tokens only, load and warm-up excluded.
All run on one device in one dtype.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

Requests = list[tuple[list[int], int]]


def _load_hf(path: Path, device: str, dtype: str, **kwargs):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **kwargs)
    return model.to(device).eval()


def _cache_kwarg(method) -> str:
    """transformers 5.x renamed `past_key_values` to `cache`; 4.x knows only the old name."""
    import inspect
    return "cache" if "cache" in inspect.signature(method).parameters else "past_key_values"


def _clocks() -> tuple[float, float]:
    """(wall, this process's CPU time in all its threads): on a machine shared with other
    work, generated tokens per CPU-second compare peers even when the wall clock cannot."""
    return time.perf_counter(), time.process_time()


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PagedPeer:
    name = "paged (this engine)"

    def __init__(self, path: Path, *, num_blocks: int, block_size: int, max_model_len: int,
                 max_num_seqs: int, device: str, dtype: str) -> None:
        from engine import LLM, SamplingParams

        self.block_size = block_size
        self.llm = LLM(model=str(path), block_size=block_size, num_gpu_blocks_override=num_blocks,
                       max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=2048, enable_prefix_caching=False, device=device,
                       dtype=dtype)
        self.device, self.dtype = self.llm.llm_engine.info.device, self.llm.llm_engine.info.dtype
        self.llm.generate({"prompt_token_ids": [5, 6, 7, 8]}, SamplingParams(max_tokens=4))

    def eos_lengths(self, prompts: list[list[int]], max_tokens: int) -> list[int]:
        """Each prompt's greedy output length up to and including its EOS (capped)."""
        from engine import SamplingParams

        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                 SamplingParams(temperature=0, max_tokens=max_tokens))
        return [len(o.outputs[0].token_ids) for o in outs]

    def run(self, requests: Requests) -> dict:
        from engine import SamplingParams

        engine = self.llm.llm_engine
        before = engine.get_stats()
        for i, (ids, out_len) in enumerate(requests):
            engine.add_request(f"bench{time.monotonic_ns()}-{i}", ids, SamplingParams(
                temperature=0, max_tokens=out_len, ignore_eos=True))
        peak_used, util_at_peak, max_running, utils = 0, 0.0, 0, []
        decode_steps: list[tuple[int, float]] = []  # (sequences, seconds) of pure-decode steps
        _sync(self.device)
        start, cpu_start = _clocks()
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            _sync(self.device)
            seqs, tokens = engine.last_step_shape
            if seqs and tokens == seqs:  # every sequence decoded one token: no prefill
                decode_steps.append((seqs, time.perf_counter() - t0))
            kv = engine.kv.stats()
            live = sum(s.num_computed_tokens for s in engine.scheduler.running)
            slots = kv.num_used * self.block_size
            if slots:
                utils.append(live / slots)
            if kv.num_used >= peak_used and slots:
                peak_used, util_at_peak = kv.num_used, live / slots
            max_running = max(max_running, len(engine.scheduler.running))
        _sync(self.device)
        elapsed, cpu = (b - a for a, b in zip((start, cpu_start), _clocks()))
        after = engine.get_stats()
        generated = after.generation_tokens - before.generation_tokens
        # the decode rate near the peak: pure-decode steps with >= 90 % of the peak batch
        near = [(n, dt) for n, dt in decode_steps if n >= 0.9 * max_running]
        return dict(cpu_seconds=cpu, generated=generated, seconds=elapsed, util=util_at_peak,
                    mean_util=statistics.fmean(utils) if utils else float("nan"),
                    concurrency=max_running, kv_slots=engine.num_blocks * self.block_size,
                    preemptions=after.num_preemptions - before.num_preemptions,
                    decode_peak_tok_s=(sum(n for n, _ in near) / sum(dt for _, dt in near)
                                       if near else float("nan")),
                    decode_peak_steps=len(near))

    def prefill(self, num_seqs: int, length: int, repeats: int) -> dict:
        """Prefill rate: `num_seqs` fresh prompts of `length` tokens, all in one step (the
        engine's token budget is 2048), one token sampled each; median of `repeats`."""
        from engine import SamplingParams

        engine, rates = self.llm.llm_engine, []
        for r in range(repeats + 1):  # the first is a warm-up
            for i in range(num_seqs):  # distinct prompts: no prefix is shared
                ids = [3 + (r * 7919 + i * 104729 + j) % 590 for j in range(length)]
                engine.add_request(f"prefill{time.monotonic_ns()}-{i}", ids,
                                   SamplingParams(temperature=0, max_tokens=1))
            _sync(self.device)
            t0, steps = time.perf_counter(), 0
            while engine.has_unfinished_requests():
                engine.step()
                steps += 1
            _sync(self.device)
            if r:
                rates.append(num_seqs * length / (time.perf_counter() - t0))
        return dict(tok_s=statistics.median(rates), min=min(rates), max=max(rates), steps=steps)


class StaticGeneratePeer:
    """`generate` on static batches, each with a `StaticCache` of max_model_len tokens per
    sequence: the KV it allocates is read back from the cache's tensors, not computed."""

    name = "transformers generate, StaticCache"

    def __init__(self, path: Path, *, batch_size: int, max_model_len: int, device: str,
                 dtype: str) -> None:
        self.model = _load_hf(path, device, dtype)
        self._kw = _cache_kwarg(self.model.forward)
        self.device, self.dtype = device, dtype
        self.batch_size, self.max_model_len = batch_size, max_model_len
        self.pad = self.model.generation_config.pad_token_id
        if self.pad is None:
            self.pad = 0
        self._run_batch([([5, 6, 7, 8], 4)] * 2)  # warm-up

    def _run_batch(self, batch: Requests) -> tuple[int, int, int]:
        import torch
        from transformers import StaticCache

        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p, _ in batch],
                           device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch],
                            device=self.device)
        new = max(o for _, o in batch)
        cache = StaticCache(config=self.model.config, max_cache_len=self.max_model_len)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=mask, **{self._kw: cache},
                                      max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                      pad_token_id=self.pad)
        keys = cache.layers[0].keys  # [batch, kv_heads, max_cache_len, head_dim]
        slots = keys.shape[0] * keys.shape[2]
        produced = out.shape[1] - width
        generated = sum(min(produced, o) for _, o in batch)  # a row's padding work is waste
        live = sum(len(p) + o for p, o in batch)
        return generated, slots, live

    def run(self, requests: Requests) -> dict:
        _sync(self.device)
        start, cpu_start = _clocks()
        batches = [self._run_batch(requests[i:i + self.batch_size])
                   for i in range(0, len(requests), self.batch_size)]
        _sync(self.device)
        elapsed, cpu = (b - a for a, b in zip((start, cpu_start), _clocks()))
        utils = [live / slots for _, slots, live in batches]
        return dict(cpu_seconds=cpu, generated=sum(g for g, _, _ in batches), seconds=elapsed,
                    util=max(utils), mean_util=statistics.fmean(utils), concurrency=self.batch_size,
                    kv_slots=max(slots for _, slots, _ in batches), preemptions=0)


class ContinuousBatchingPeer:
    """transformers' own continuous batching (`generate_batch`'s manager), paged, given the
    same number of KV blocks of the same size as this engine."""

    name = "transformers generate_batch"

    def __init__(self, path: Path, *, num_blocks: int, block_size: int, device: str,
                 dtype: str) -> None:
        self.model = _load_hf(path, device, dtype, attn_implementation="sdpa")
        self.device, self.dtype = device, dtype
        self.num_blocks, self.block_size = num_blocks, block_size

    def run(self, requests: Requests) -> dict:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                               max_new_tokens=16)
        cbc = ContinuousBatchingConfig(page_size=self.block_size, num_blocks=self.num_blocks,
                                       max_batch_tokens=2048, use_cuda_graph=False)
        with self.model.continuous_batching_context_manager(
                generation_config=gen, continuous_batching_config=cbc, block=True,
                timeout=5) as mgr:
            mgr.add_request([5, 6, 7, 8], max_new_tokens=4)  # warm-up
            while not (r := mgr.get_result(timeout=1)) or not r.is_finished():
                pass
            start, cpu_start = _clocks()
            for ids, out_len in requests:
                mgr.add_request(ids, max_new_tokens=out_len)
            done, generated = 0, 0
            while done < len(requests):
                result = mgr.get_result(timeout=1)
                if result is not None and result.is_finished():
                    done += 1
                    generated += len(result.generated_tokens)
                elif result is None and not mgr.is_running():
                    raise RuntimeError("transformers' continuous batching manager stopped")
            elapsed, cpu = (b - a for a, b in zip((start, cpu_start), _clocks()))
        return dict(cpu_seconds=cpu, generated=generated, seconds=elapsed, util=float("nan"),
                    mean_util=float("nan"), concurrency=None,
                    kv_slots=self.num_blocks * self.block_size, preemptions=None)


class DecodeCeilingPeer:
    """The limit: the same model's own batched decode (contiguous cache, no scheduling, no
    prefill counted) for a static batch of the engine's peak concurrency at the workload's
    mean context length. Tokens/s of this row is what the model code can do here."""

    name = "ceiling: transformers batched decode"

    def __init__(self, path: Path, *, device: str, dtype: str, steps: int = 32) -> None:
        self.model = _load_hf(path, device, dtype)
        self.device, self.dtype, self.steps = device, dtype, steps
        self.batch, self.context = 1, 16

    def configure(self, batch: int, context: int) -> None:
        self.batch, self.context = max(1, batch), max(1, context)

    def prefill(self, num_seqs: int, length: int, repeats: int) -> dict:
        """The model's own prefill of the same shape: one forward over a [num_seqs, length]
        batch (equal lengths: no padding), writing a fresh KV cache, logits for the last
        position only (as the engine computes them); median of `repeats`."""
        import torch
        from transformers import DynamicCache

        kw, rates = _cache_kwarg(self.model.forward), []
        with torch.no_grad():
            for r in range(repeats + 1):  # the first is a warm-up
                ids = torch.tensor([[3 + (r * 7919 + i * 104729 + j) % 590 for j in range(length)]
                                    for i in range(num_seqs)], device=self.device)
                _sync(self.device)
                t0 = time.perf_counter()
                self.model(ids, use_cache=True, logits_to_keep=1,
                           **{kw: DynamicCache(config=self.model.config)})
                _sync(self.device)
                if r:
                    rates.append(num_seqs * length / (time.perf_counter() - t0))
        return dict(tok_s=statistics.median(rates), min=min(rates), max=max(rates), steps=1)

    def run(self, requests: Requests) -> dict:
        import torch
        from transformers import DynamicCache

        vocab = self.model.config.get_text_config().vocab_size
        ids = torch.randint(3, min(vocab, 600), (self.batch, self.context), device=self.device,
                            generator=torch.Generator(device=self.device).manual_seed(0))
        kw = _cache_kwarg(self.model.forward)
        with torch.no_grad():
            cache = {kw: DynamicCache(config=self.model.config)}
            logits = self.model(ids, use_cache=True, **cache).logits
            token = logits[:, -1:].argmax(-1)
            for _ in range(2):  # warm-up steps, not timed
                token = self.model(token, **cache).logits[:, -1:].argmax(-1)
            _sync(self.device)
            start, cpu_start = _clocks()
            for _ in range(self.steps):  # token: [batch, 1]; the cache grows by one a step
                token = self.model(token, **cache).logits[:, -1:].argmax(-1)
            _sync(self.device)
            elapsed, cpu = (b - a for a, b in zip((start, cpu_start), _clocks()))
        return dict(cpu_seconds=cpu, generated=self.batch * self.steps, seconds=elapsed,
                    util=float("nan"), mean_util=float("nan"), concurrency=self.batch,
                    kv_slots=None, preemptions=None)
