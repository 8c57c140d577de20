"""Turns a scheduled batch into tensors, runs the HF model on the paged cache, sizes the pool."""
from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine.attention import PAGED_ATTENTION, AttentionMetadata
from engine.config import EngineConfig
from engine.kv_capacity import KVShape, dtype_name, num_kv_blocks
from engine.scheduler import ScheduledBatch
from paged_kernels import get_backend

_DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, hf_config, device: torch.device) -> torch.dtype:
    """engine.kv_capacity.dtype_name's rule (the tuner sizes pools with it too)."""
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    return _DTYPES[dtype_name(name, dtype, device.type)]


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_reset_peak_rss() -> int:
    """Reset the process's peak-RSS mark where Linux allows it; return the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    rss = _proc_status_bytes("VmRSS")
    return rss if rss is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_peak_rss() -> int:
    hwm = _proc_status_bytes("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: Path) -> None:
        self.config = config
        self.device = pick_device(config.device)
        if self.device.type == "cpu" and config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)  # process-wide, as in vLLM's CPU backend
        hf_config = AutoConfig.from_pretrained(model_path)
        self.dtype = pick_dtype(config.dtype, hf_config, self.device)
        torch.manual_seed(config.seed)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=self.dtype, attn_implementation=PAGED_ATTENTION).to(self.device).eval()
        self.hf_config = self.model.config
        self.backend = get_backend(config.attention_backend, self.device)
        self.backend.check_values = False  # the runner builds the metadata; checks cost a sync
        text = self.hf_config.get_text_config()
        if getattr(text, "attn_logit_softcapping", None):
            raise ValueError(f"{text.model_type} needs attention logit soft-capping, which the paged "
                             "attention kernels do not implement; use a model without it")
        self.kv_shape = KVShape.of(text)   # engine/kv_capacity.py, shared with the tuner
        self.num_layers = self.kv_shape.num_layers
        self.num_kv_heads = self.kv_shape.num_kv_heads
        self.head_dim = self.kv_shape.head_dim
        self.vocab_size = text.vocab_size
        self.block_size = config.block_size
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []

    # ---- KV cache sizing ------------------------------------------------------------------
    @property
    def kv_bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.kv_shape.bytes_per_block(self.block_size, elem)

    def device_memory_bytes(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).total_memory
        return int(self.config.cpu_memory_gib * 2**30)

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def profile_peak_activation_bytes(self, num_tokens: int, num_seqs: int) -> int:
        """One forward at the largest batch the scheduler can form; its peak memory."""
        num_seqs = max(1, min(num_seqs, num_tokens))
        lens = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
        blocks_per_seq = [-(-n // self.block_size) for n in lens]
        self.allocate_kv_cache(sum(blocks_per_seq))
        tables, start = [], 0
        for nb in blocks_per_seq:
            tables.append(list(range(start, start + nb)))
            start += nb
        token_ids = [[1] * n for n in lens]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        else:
            base = _cpu_reset_peak_rss()
        self._forward(token_ids, [0] * num_seqs, lens, tables, list(range(num_seqs)))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - base
        else:
            peak = _cpu_peak_rss() - base
        self.kv_caches = []
        return max(0, peak)

    def determine_num_blocks(self, max_model_len: int) -> int:
        cfg = self.config
        if cfg.num_gpu_blocks_override is not None:
            return cfg.num_gpu_blocks_override
        total = self.device_memory_bytes()
        weights = self.weight_bytes()
        activations = self.profile_peak_activation_bytes(
            cfg.max_num_batched_tokens, cfg.max_num_seqs)
        num_blocks = num_kv_blocks(device_bytes=total, fraction=cfg.gpu_memory_utilization,
                                   weight_bytes=weights, activation_bytes=activations,
                                   block_bytes=self.kv_bytes_per_block)
        if num_blocks < 1:
            where = "cpu_memory_gib (--cpu-memory-gib)" if self.device.type == "cpu" else "the GPU"
            raise ValueError(
                f"no memory left for the KV cache: {cfg.gpu_memory_utilization} x {total / 2**30:.2f} "
                f"GiB of {where} minus weights {weights / 2**30:.2f} GiB and activations "
                f"{activations / 2**30:.2f} GiB; raise gpu_memory_utilization or lower "
                "max_num_batched_tokens")
        return num_blocks

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """One pool tensor; each layer gets (key, value) views of [num_blocks, block_size, H, D]."""
        pool = torch.zeros(2, self.num_layers, num_blocks, self.block_size, self.num_kv_heads,
                           self.head_dim, dtype=self.dtype, device=self.device)
        self.kv_caches = [(pool[0, i], pool[1, i]) for i in range(self.num_layers)]
        self.kv_pool = pool  # whole blocks, for the KV tiers' copies (engine/kv_offload/)

    def offload_io(self):
        """What moves blocks between this pool and the KV tiers (engine/kv_offload/)."""
        from engine.kv_offload import pool_io

        return pool_io(self.kv_pool)

    @staticmethod
    def is_device_fault(exc: BaseException) -> bool:
        """Whether the accelerator itself failed (every later step would too), as opposed to
        one request's work raising."""
        accelerator_error = getattr(torch, "AcceleratorError", None)
        if accelerator_error is not None and isinstance(exc, accelerator_error):
            return True
        message = str(exc)
        return "CUDA error" in message or "device-side assert" in message

    # ---- one step -------------------------------------------------------------------------
    def execute(self, batch: ScheduledBatch, prompt_logits: dict[int, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[int]]:
        """Run one step. Returns logits [num_sampled, vocab] (fp32) and, for each row, the
        index into batch.seqs of the sequence whose chunk reached its last token. A sequence
        with d draft tokens (batch.draft_token_ids) has 1 + d consecutive rows: the logits
        after its last token, then after each draft.

        `prompt_logits`, if given, receives for each sequence with `wants_prompt_logits` the
        logits [m, vocab] of its chunk's first m positions that predict a prompt token
        (positions c .. c+m-1 predict prompt tokens c+1 .. c+m; c = num_computed_tokens).
        """
        if batch.blocks_to_copy:
            mapping = torch.tensor(batch.blocks_to_copy, dtype=torch.int64, device=self.device)
            self.backend.copy_blocks([k for k, _ in self.kv_caches],
                                     [v for _, v in self.kv_caches], mapping)
        token_ids, starts, lens, tables, sample_rows, prompt_rows = [], [], [], [], [], []
        drafts = batch.draft_token_ids or [[]] * len(batch.seqs)
        num_kept: list[int] = []  # logits rows per sample row: 1 + its drafts
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            c = seq.num_computed_tokens
            d = len(drafts[i])
            token_ids.append(seq.token_ids[c:c + n - d] + drafts[i] if d else seq.token_ids[c:c + n])
            starts.append(c)
            lens.append(c + n)
            tables.append(seq.block_table)
            if c + n - d == seq.num_tokens:
                sample_rows.append(i)
                num_kept.append(1 + d)
            m = min(n, seq.num_prompt_tokens - 1 - c)
            if prompt_logits is not None and seq.wants_prompt_logits and m > 0:
                prompt_rows.append((i, m))
        num_sampled = sum(num_kept)
        if num_sampled == len(sample_rows):  # no drafts
            num_kept = None
        else:
            sample_rows = [i for i, m in zip(sample_rows, num_kept) for _ in range(m)]
        logits = self._forward(token_ids, starts, lens, tables, sample_rows, prompt_rows,
                               num_kept)
        if prompt_logits is not None:
            rest = logits[num_sampled:]
            for (i, m), part in zip(prompt_rows, rest.split([m for _, m in prompt_rows])):
                prompt_logits[i] = part
        return logits[:num_sampled], sample_rows

    @torch.inference_mode()
    def _forward(self, token_ids: list[list[int]], starts: list[int], lens: list[int],
                 tables: list[list[int]], sample_rows: list[int],
                 prompt_rows: list[tuple[int, int]] = (),
                 num_kept: list[int] | None = None) -> torch.Tensor:
        q_lens = np.array([len(t) for t in token_ids], dtype=np.int64)
        cu = np.zeros(len(q_lens) + 1, dtype=np.int64)
        np.cumsum(q_lens, out=cu[1:])
        # positions of every new token: start of its sequence's chunk + offset in the chunk
        seq_of_token = np.repeat(np.arange(len(q_lens)), q_lens)
        positions = np.asarray(starts, dtype=np.int64)[seq_of_token] + (
            np.arange(cu[-1]) - cu[:-1][seq_of_token])
        max_blocks = max(len(t) for t in tables)
        table_arr = np.zeros((len(tables), max_blocks), dtype=np.int64)
        for i, t in enumerate(tables):
            table_arr[i, :len(t)] = t
        slots = table_arr[seq_of_token, positions // self.block_size] * self.block_size + (
            positions % self.block_size)
        dev = self.device
        flat_ids = np.fromiter((t for ts in token_ids for t in ts), dtype=np.int64, count=int(cu[-1]))
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slots).to(dev),
            cu_seqlens_q=torch.from_numpy(cu).to(dev, torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            block_tables=torch.from_numpy(table_arr).to(dev, torch.int32),
            kv_caches=self.kv_caches, backend=self.backend)
        # the last token of each sampled row, then the prompt positions asked for
        last = cu[1:][sample_rows] - 1
        if num_kept is not None:  # sample_rows lists row i num_kept times: its last tokens
            m = np.asarray(num_kept, dtype=np.int64)
            last = last + np.arange(len(last)) - np.repeat(np.cumsum(m) - 1, m)
        keep_idx = [last] + [np.arange(cu[i], cu[i] + m) for i, m in prompt_rows]
        keep_rows = np.concatenate(keep_idx).astype(np.int64)
        # every token's logits, in order (a pure decode step): 0 keeps all, no gather
        keep = 0 if np.array_equal(keep_rows, np.arange(cu[-1])) else \
            torch.from_numpy(keep_rows).to(dev)
        out = self.model(input_ids=torch.from_numpy(flat_ids).to(dev)[None],
                         position_ids=torch.from_numpy(positions).to(dev)[None],
                         logits_to_keep=keep, paged_metadata=meta, use_cache=False)
        return out.logits[0].float()
