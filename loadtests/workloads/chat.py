"""chat: a shared system prompt plus multi-turn conversations whose history grows.

Request stream (lengths in words at --length-scale 1; every length scales with it):
- system prompt: 300 words, identical for every user and conversation (prefix reuse
  across users);
- a conversation has 2-6 turns (uniform); each user message is 20-80 words (uniform);
  each reply asks for 32-96 tokens (uniform, `max_tokens`, EOS ignored);
- each turn resends the whole history (system + earlier turns + replies), so later turns
  reuse the earlier turns' KV (prefix reuse within a conversation); a conversation also
  ends once its history passes 1500 words, or, when the driver knows the model's context
  (max_model_len), before a turn whose prompt and reply might not fit it (the history's
  tokens estimated at the last prompt's tokens per character: base.ContextBudget).
Endpoint: /v1/chat/completions, streamed.
Default SLOs: TTFT <= 1.0 s and TPOT (a request's time per output token after the first) <= 0.1 s.
Default load: 8 closed-loop users.
"""
from __future__ import annotations

import functools
import random

from loadtests.workloads.base import (BudgetedSession, ContextBudget, Request, WorkloadSpec,
                                      uniform, words)

SYSTEM_WORDS = 300
TURNS = (2, 6)
USER_WORDS = (20, 80)
REPLY_TOKENS = (32, 96)
MAX_HISTORY_WORDS = 1500
_SYSTEM_SEED = 20240601  # fixed: the system prompt is the same for every user


@functools.lru_cache(maxsize=16)
def system_prompt(scale: float = 1.0) -> str:
    """The same text every time for a scale: drawn once (the simulator starts thousands of
    sessions a capacity search)."""
    body = words(random.Random(_SYSTEM_SEED), max(1, round(SYSTEM_WORDS * scale)))
    return "You are a helpful assistant. Follow these house rules: " + body


class Conversation(BudgetedSession):
    """A chat session; `messages` grows by two entries per turn."""

    kind = "chat"

    def __init__(self, rng: random.Random, scale: float = 1.0) -> None:
        self._rng, self._scale = rng, scale
        self._turns_left = rng.randint(*TURNS)
        self.budget = ContextBudget()
        self.messages = [{"role": "system", "content": system_prompt(scale)}]

    def _history_words(self) -> int:
        return sum(len(m["content"].split()) for m in self.messages)

    def next_request(self) -> Request | None:
        if self._turns_left <= 0 or self._history_words() > MAX_HISTORY_WORDS * self._scale:
            return None
        self._turns_left -= 1
        self.messages.append({"role": "user", "content": words(
            self._rng, uniform(self._rng, *USER_WORDS, scale=self._scale))})
        max_tokens = uniform(self._rng, *REPLY_TOKENS, scale=self._scale)
        chars = sum(len(m["content"]) for m in self.messages)
        if not self.budget.fits(chars, max_tokens):  # the turn might not fit: the end
            self.messages.pop()
            self._turns_left = 0
            return None
        self.budget.sent(chars)
        return Request(self.kind, "/v1/chat/completions", {
            "messages": [dict(m) for m in self.messages],
            "max_tokens": max_tokens,
        })

    def record_response(self, text: str, prompt_tokens: int | None = None) -> None:
        self.budget.served(prompt_tokens)
        self.messages.append({"role": "assistant", "content": text})


WORKLOAD = WorkloadSpec(
    name="chat",
    description="shared system prompt + growing multi-turn conversations",
    new_session=lambda rng, scale: Conversation(rng, scale),
    slos={"chat": {"ttft": 1.0, "tpot": 0.1}},
    primary_latency="ttft",
    users=8,
    tune_also=("kv_offloading_size",),  # revisits long prefixes (a host KV tier)
)
