"""Request streams for the simulator: the workloads' own open-loop arrival process, or a
trace at its arrival times (scaled in speed), as token ids in virtual time.

A workload stream follows the Locust users' open loop (loadtests/common.py): `users`
independent Poisson processes at rate / users each; an arrival continues one of its
user's waiting multi-turn sessions with probability REVISIT_IDLE_SESSION, else starts a new
one; a session waits again once its reply has finished (the reply's length in words,
about the tokens it had, joins the history), unless that was its last turn. Chat
prompts are rendered with the model's chat template and tokenized by the model's
tokenizer, as the server does (`Renderer`).
"""
from __future__ import annotations

import heapq
import math
import random
import weakref
from dataclasses import dataclass, field

from engine.entrypoints.serving import length_refusal
from loadtests.workloads.base import OpenLoop, WorkloadSpec, park, words
from loadtests.workloads.trace import TraceRequest, build_request, trace_rate


@dataclass
class SimRequest:
    arrival: float
    kind: str
    prompt_ids: list[int]
    max_tokens: int
    user: int = 0
    session: object | None = field(default=None, repr=False)
    number: int = 0
    temperature: float | None = None   # the request's own; None: the server's default
    refused: str | None = None   # the server's 400 (over max_model_len): not served


WORD_SAMPLE = 480   # words the tokens-per-word figure is measured on


class Renderer:
    """A workload request's prompt as the server tokenizes it (the chat template, then the
    tokenizer), remembered: every probe and setting of a sweep replays the same sessions,
    and rendering a long history costs more than simulating its request."""

    MAX_ENTRIES = 50_000

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict = {}
        self._tokens_per_word: float | None = None

    @property
    def tokens_per_word(self) -> float:
        """What one of the workloads' words (loadtests.workloads.base.words) costs in this
        tokenizer's tokens, measured once on a fixed sample of them."""
        if self._tokens_per_word is None:
            sample = words(random.Random(0), WORD_SAMPLE)
            ids = self.tokenizer.encode(sample, add_special_tokens=False)
            self._tokens_per_word = max(len(ids), 1) / WORD_SAMPLE
        return self._tokens_per_word

    def __call__(self, request) -> list[int]:
        body = request.body
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            return list(prompt)
        key = prompt if prompt is not None else tuple(
            (m["role"], m["content"]) for m in body["messages"])
        ids = self._cache.get(key)
        if ids is None:
            if len(self._cache) >= self.MAX_ENTRIES:
                self._cache.clear()
            if prompt is not None:
                ids = self.tokenizer.encode(prompt)
            else:
                ids = list(self.tokenizer.apply_chat_template(
                    body["messages"], add_generation_prompt=True, tokenize=True,
                    return_dict=False))
            self._cache[key] = ids
        return ids


class WorkloadStream:
    def __init__(self, workload: WorkloadSpec, *, rate: float, users: int, render: Renderer,
                 seed: int = 0, length_scale: float = 1.0, max_model_len: int) -> None:
        if not rate > 0:
            raise ValueError(f"the arrival rate must be > 0 requests/s, got {rate}")
        self.workload, self.render, self.seed = workload, render, seed
        self.scale, self.max_model_len = length_scale, max_model_len
        users = max(1, users)
        self.user_rate = rate / users
        self.arrivals = [OpenLoop(seed, u, self.user_rate) for u in range(users)]
        self.sessions = [random.Random(seed * 100_003 + u) for u in range(users)]
        self.started = [0] * users          # sessions each user has begun
        # each session's replies' words, on a generator of its own (see finished)
        self._replies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.idle: list[list] = [[] for _ in range(users)]
        self.count = 0
        self._next = [(loop.gap(), u) for u, loop in enumerate(self.arrivals)]
        heapq.heapify(self._next)

    def next_time(self) -> float:
        return self._next[0][0]

    def arrivals_until(self, t: float) -> int:
        """How many requests arrive by `t` (the users' gaps drawn afresh, as pop draws them:
        the arrival times depend on the seed and rate alone)."""
        count = 0
        for u in range(len(self.arrivals)):
            loop = OpenLoop(self.seed, u, self.user_rate)
            at = loop.gap()
            while at <= t:
                count, at = count + 1, at + loop.gap()
        return count

    def pop(self) -> SimRequest:
        t, u = heapq.heappop(self._next)
        heapq.heappush(self._next, (t + self.arrivals[u].gap(), u))
        picked = self.arrivals[u].pick(self.idle[u])
        if picked is None:
            session = self.workload.start_session(self.sessions[u], self.scale,
                                                  self.max_model_len)
            self._replies[session] = random.Random(f"{self.seed}:{u}:{self.started[u]}")
            self.started[u] += 1
            picked = session, session.next_request()
        session, request = picked
        ids = self.render(request)
        max_tokens = int(request.body.get("max_tokens") or 16)
        # a history past the model's length is refused, as the server refuses it
        refused = length_refusal(len(ids), max_tokens, self.max_model_len)
        self.count += 1
        return SimRequest(t, request.kind, ids, max_tokens, u, session, self.count,
                          request.body.get("temperature"), refused and refused[0])

    def finished(self, request: SimRequest, output_tokens: int) -> None:
        if request.session is not None:
            # the reply as words of about the tokens it was written in (the next turn reads
            # it back: a reply of n tokens lengthens the history by about n, not by the 2.5
            # n that n x 3/4 of the workloads' words cost the embedded model's tokenizer);
            # drawn from the session's own generator, so a session's j-th turn reads the
            # same history at every rate, probe and setting that replies as long (and the
            # Renderer renders it once)
            per_word = getattr(self.render, "tokens_per_word", 4 / 3)  # a bare render: ~English
            n = max(1, round(output_tokens / per_word))
            # a refused request's reply is empty and its prompt uncounted, as the load
            # client records a 400; a served one's prompt tokens are the server's usage
            request.session.record_response(
                words(self._replies[request.session], n) if output_tokens else "",
                None if request.refused else len(request.prompt_ids))
            park(self.idle[request.user], request.session)


class TraceStream:
    """A trace replayed at `speed` x its own pace (speed = rate / the trace's rate).
    `loop`: once it ends it starts again, one mean gap after its last request (each
    request of a later round with its own prompt), so that a fast replay still fills a
    load window: the SLO planner's trace of a mix is a sample, not a recording."""

    def __init__(self, trace: list[TraceRequest], *, rate: float | None = None, seed: int = 0,
                 length_scale: float = 1.0, max_model_len: int, loop: bool = False) -> None:
        if not trace:
            raise ValueError("the trace holds no requests")
        if rate is not None and not rate > 0:
            raise ValueError(f"the arrival rate must be > 0 requests/s, got {rate}")
        self.trace, self.seed, self.scale = trace, seed, length_scale
        self.max_model_len = max_model_len
        self.speed = rate / trace_rate(trace) if rate else 1.0
        self.loop = loop
        self._i = 0
        self._t0 = trace[0].timestamp
        span = trace[-1].timestamp - self._t0
        self._period = span + (span / (len(trace) - 1) if len(trace) > 1 and span > 0
                               else 1.0 / trace_rate(trace))

    def _time(self, i: int) -> float:
        rounds, j = divmod(i, len(self.trace))
        return (rounds * self._period + self.trace[j].timestamp - self._t0) / self.speed

    def next_time(self) -> float:
        if self._i >= len(self.trace) and not self.loop:
            return float("inf")
        return self._time(self._i)

    def arrivals_until(self, t: float) -> int:
        offsets = [(r.timestamp - self._t0) / self.speed for r in self.trace]
        if not self.loop:
            return sum(o <= t for o in offsets)
        period = self._period / self.speed
        rounds = max(0, math.floor(t / period))
        return rounds * len(self.trace) + sum(o <= t - rounds * period for o in offsets)

    def pop(self) -> SimRequest:
        t, i = self.next_time(), self._i
        self._i += 1
        r = build_request(self.trace[i % len(self.trace)], i, seed=self.seed,
                          scale=self.scale, max_model_len=self.max_model_len)
        return SimRequest(t, r.kind, list(r.body["prompt"]), r.body["max_tokens"])

    def finished(self, request: SimRequest, output_tokens: int) -> None:
        pass
