"""Logits → next tokens: penalties, min_tokens, temperature, top-k/top-p/min-p, seeds, logprobs.

Rows are processed together; only seeded rows draw from their own generators (so a seeded
request gives the same tokens whatever else shares its batch).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sequence import Sequence


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]  # of the chosen tokens
    top_logprobs: list[dict[int, float] | None]


class Sampler:
    def __init__(self, *, eos_token_ids: frozenset[int], seed: int, device: torch.device) -> None:
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._seq_generators: dict[int, torch.Generator] = {}

    def forget(self, seq: Sequence) -> None:
        self._seq_generators.pop(seq.seq_id, None)

    def _generator(self, seq: Sequence) -> torch.Generator:
        gen = self._seq_generators.get(seq.seq_id)
        if gen is None:  # sample i of a request seeded s draws like a request seeded s + i
            gen = torch.Generator(device=self.device).manual_seed(seq.params.seed + seq.index)
            self._seq_generators[seq.seq_id] = gen
        return gen

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        # logits: [num_rows, vocab] fp32, one row per sequence
        logits = logits.clone()
        self._apply_penalties(logits, seqs)
        self._apply_min_tokens(logits, seqs)
        raw_logprobs = torch.log_softmax(logits, dim=-1)

        temps = torch.tensor([s.params.temperature for s in seqs], device=logits.device)
        greedy = temps == 0
        chosen = torch.argmax(logits, dim=-1)
        if not bool(greedy.all()):
            scaled = logits / torch.where(greedy, 1.0, temps).unsqueeze(1)
            probs = torch.softmax(self._truncate(scaled, seqs), dim=-1)
            # Exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p.
            noise = torch.ones_like(probs)
            rows = [i for i, s in enumerate(seqs) if s.params.temperature > 0]
            unseeded = [i for i in rows if seqs[i].params.seed is None]
            if unseeded:
                noise[unseeded] = torch.empty(len(unseeded), probs.shape[1], device=probs.device
                                              ).exponential_(generator=self.generator)
            for i in rows:
                if seqs[i].params.seed is not None:
                    noise[i] = torch.empty(probs.shape[1], device=probs.device
                                           ).exponential_(generator=self._generator(seqs[i]))
            sampled = torch.argmax(probs / noise, dim=-1)
            chosen = torch.where(greedy, chosen, sampled)

        chosen_lp = raw_logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
        top: list[dict[int, float] | None] = [None] * len(seqs)
        k_max = max((s.params.logprobs or 0) for s in seqs)
        if any(s.params.logprobs is not None for s in seqs):
            top_vals, top_ids = raw_logprobs.topk(max(k_max, 1), dim=-1)
            for i, s in enumerate(seqs):
                if s.params.logprobs is not None:
                    k = s.params.logprobs
                    entry = dict(zip(top_ids[i, :k].tolist(), top_vals[i, :k].tolist()))
                    entry[int(chosen[i])] = float(chosen_lp[i])
                    top[i] = entry
        return SampleResult(chosen.tolist(), chosen_lp.tolist(), top)

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        rows = [i for i, s in enumerate(seqs) if s.params.needs_penalties]
        if not rows:
            return
        vocab = logits.shape[1]
        for i in rows:  # only penalised rows; counts are built per row from token lists
            p = seqs[i].params
            out_ids = torch.tensor(seqs[i].output_token_ids, dtype=torch.int64, device=logits.device)
            if p.repetition_penalty != 1.0:
                seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
                seen[torch.tensor(seqs[i].token_ids, device=logits.device)] = True
                row = logits[i]
                penalised = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
                logits[i] = torch.where(seen, penalised, row)
            if out_ids.numel() and (p.presence_penalty or p.frequency_penalty):
                counts = torch.bincount(out_ids, minlength=vocab).to(logits.dtype)
                logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)

    def _apply_min_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        for i, s in enumerate(seqs):
            if s.num_output_tokens < s.params.min_tokens:
                banned = set(s.params.stop_token_ids)
                if not s.params.ignore_eos:
                    banned |= self.eos_token_ids
                if banned:
                    logits[i, list(banned)] = float("-inf")

    @staticmethod
    def _truncate(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Top-k, top-p and min-p, vectorised over rows with per-row settings."""
        vocab = logits.shape[1]
        dev = logits.device
        top_k = torch.tensor([s.params.top_k if s.params.top_k > 0 else vocab for s in seqs], device=dev)
        top_p = torch.tensor([s.params.top_p for s in seqs], device=dev)
        min_p = torch.tensor([s.params.min_p for s in seqs], device=dev)
        if bool((top_k >= vocab).all() & (top_p >= 1).all() & (min_p <= 0).all()):
            return logits
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=dev).unsqueeze(0)
        drop = ranks >= top_k.unsqueeze(1)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_p.unsqueeze(1)
        drop |= probs < (min_p * probs[:, :1])
        drop[:, 0] = False  # the most likely token always survives
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)
