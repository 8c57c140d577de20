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
        self.structured = None  # a StructuredOutputManager once a request needs one

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, targets: list[int], k: int
                        ) -> list[dict[int, float]]:
        return prompt_logprobs(logits, targets, k)

    def forget(self, seq: Sequence) -> None:
        self._seq_generators.pop(seq.seq_id, None)

    def snapshot(self, seqs: list[Sequence]) -> tuple[int, dict[int, torch.Tensor]]:
        """The seeded streams of `seqs`, so that a failed step can be redone drawing the same."""
        states = {s.seq_id: g.get_state() for s in seqs
                  if (g := self._seq_generators.get(s.seq_id)) is not None}
        return len(self._seq_generators), states

    def restore(self, snapshot: tuple[int, dict[int, torch.Tensor]]) -> None:
        num_before, states = snapshot
        for seq_id in list(self._seq_generators)[num_before:]:  # made since (new forks)
            del self._seq_generators[seq_id]
        for seq_id, state in states.items():
            self._seq_generators[seq_id].set_state(state)

    def _generator(self, seq: Sequence) -> torch.Generator:
        gen = self._seq_generators.get(seq.seq_id)
        if gen is None:  # sample i of a request seeded s draws like a request seeded s + i
            gen = torch.Generator(device=self.device).manual_seed(seq.params.seed + seq.index)
            self._seq_generators[seq.seq_id] = gen
        return gen

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        # logits: [num_rows, vocab] fp32, one row per sequence
        logits = self.process(logits, seqs)
        raw_logprobs = torch.log_softmax(logits, dim=-1)

        temps = torch.tensor([s.params.temperature for s in seqs], device=logits.device)
        greedy = temps == 0
        chosen = torch.argmax(logits, dim=-1)
        if not bool(greedy.all()):
            probs = self.distribution(logits, seqs)
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

    def process(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The processed logits of each row (a copy, if any row has a processor): logit_bias,
        penalties, the grammar's mask for structured rows, then min_tokens (unless the
        grammar allows nothing but a stop token, which then wins); temperature and truncation
        come after (`distribution`). A speculative verifier reads its target rows through
        this too. When no row has one, nothing writes and `logits` itself comes back."""
        if any(s.params.logit_bias or s.params.needs_penalties or s.params.structured_outputs
               is not None or s.num_output_tokens < s.params.min_tokens for s in seqs):
            logits = logits.clone()
        self._apply_logit_bias(logits, seqs)
        self._apply_penalties(logits, seqs)
        if self.structured is not None:
            self.structured.apply_masks(logits, seqs)
        self._apply_min_tokens(logits, seqs)
        return logits

    def distribution(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Probabilities [rows, vocab] the sampler draws from, given processed logits:
        temperature, then top-k/top-p/min-p; a greedy row is one-hot on its argmax."""
        temps = torch.tensor([s.params.temperature for s in seqs], device=logits.device)
        greedy = temps == 0
        scaled = logits / torch.where(greedy, 1.0, temps).unsqueeze(1)
        probs = torch.softmax(self._truncate(scaled, seqs), dim=-1)
        if bool(greedy.any()):
            onehot = torch.zeros_like(probs).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
            probs = torch.where(greedy.unsqueeze(1), onehot, probs)
        return probs

    @staticmethod
    def _apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
        for i, s in enumerate(seqs):
            if s.params.logit_bias:
                ids = torch.tensor(list(s.params.logit_bias), device=logits.device)
                bias = torch.tensor(list(s.params.logit_bias.values()), dtype=logits.dtype,
                                    device=logits.device)
                logits[i].index_add_(0, ids, bias)

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
                    row = logits[i].index_fill(0, torch.tensor(sorted(banned)), float("-inf"))
                    if bool(torch.isfinite(row).any()):  # a grammar may allow only a stop
                        logits[i] = row

    @staticmethod
    def _truncate(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        vocab = logits.shape[1]
        # top_k >= vocab (any size: the clamp happens before a tensor is made) means "off"
        top_k = [s.params.top_k if 0 < s.params.top_k < vocab else vocab for s in seqs]
        top_p = [s.params.top_p for s in seqs]
        min_p = [s.params.min_p for s in seqs]
        if all(k == vocab for k in top_k) and all(p >= 1 for p in top_p) and not any(min_p):
            return logits
        dev = logits.device
        return truncate(logits, torch.tensor(top_k, device=dev),
                        torch.tensor(top_p, device=dev, dtype=torch.float64),
                        torch.tensor(min_p, device=dev, dtype=logits.dtype))


def prompt_logprobs(logits: torch.Tensor, targets: list[int], k: int
                    ) -> list[dict[int, float]]:
    """Log-probabilities of `targets` under the model's raw distribution, with the top k
    alternatives: logits [m, vocab] at positions p .. p+m-1, targets the tokens at p+1 ..
    p+m (as vLLM's prompt_logprobs: no penalty, temperature or bias applies to the prompt)."""
    lps = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(targets, dtype=torch.int64, device=lps.device)
    chosen = lps.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()
    if k > 0:
        top_vals, top_ids = lps.topk(k, dim=-1)
        tops = [dict(zip(i, v)) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
    else:
        tops = [{} for _ in targets]
    for top, t, lp in zip(tops, targets, chosen):
        top[t] = lp
    return tops


def truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
             min_p: torch.Tensor) -> torch.Tensor:
    """Top-k, then top-p, then min-p, each on the distribution the previous one left
    (transformers' warper order, vLLM's masks); the most likely token always survives.

    logits: [rows, vocab] (temperature already applied); top_k: int [rows] in [1, vocab]
    (vocab: off); top_p: float64 [rows] in (0, 1] (1: off); min_p: [rows] in [0, 1] (0: off).
    """
    vocab = logits.shape[1]
    # Ascending order, as transformers and vLLM sort: the cut-offs below scan from the tail.
    sorted_logits, order = logits.sort(dim=-1)
    # top-k by value: every token tied with the k-th largest stays
    kth = sorted_logits.gather(1, (vocab - top_k).long().unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    # top-p on the renormalised survivors: drop the tail whose mass is <= 1 - top_p
    tail_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # 1 - top_p rounded once to the logits' dtype, as transformers' `1 - self.top_p` is
    threshold = (1 - top_p).to(logits.dtype).unsqueeze(1)
    drop = (tail_mass <= threshold) & (top_p < 1).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    # min-p: below min_p times the most likely token's probability (scale-free, so the
    # renormalisation after top-p does not change it; the top token never falls below it)
    probs = sorted_logits.softmax(dim=-1)
    drop = probs < min_p.unsqueeze(1) * probs[:, -1:]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
