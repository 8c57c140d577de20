"""Shared pieces of every workload: requests, sessions, SLOs and seeded text.

Lengths are counted in words of a fixed synthetic vocabulary; for byte-pair tokenizers
a word is about 1-2 tokens. Every generator takes a `random.Random`, so one seed fixes the
whole request stream and every trial of a sweep sees the same prompts.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

# A neutral vocabulary: short, common, ASCII words, so any tokenizer handles them.
_WORDS = (
    "the of and to in is was for on are with as be at by this have from or one had not "
    "but what all were when we there can an your which their said if do will each about "
    "how up out them then she many some so these would other into has more her two like "
    "him see time could no make than first been its who now people my made over did down "
    "only way find use may water long little very after words called just where most know "
    "get through back much before go good new write our used me man too any day same right "
    "look think also around another came come work three word must because does part even "
    "place well such here take why things help put years different away again off went old "
    "number great tell men say small every found still between name should home big give air "
    "line set own under read last never us left end along while might next sound below saw "
    "something thought both few those always looked show large often together asked house "
    "world going want school important until form food keep children feet land side without "
    "boy once animals life enough took sometimes four head above kind began almost live page "
    "got earth need far hand high year mother light parts country father let night following "
    "picture being study second eyes soon times story boys since white days ever paper hard "
    "near sentence better best across during today others sure means knew try told young "
    "miles sun ways thing whole hear example heard several change answer room sea against top"
).split()


def words(rng: random.Random, n: int) -> str:
    """`n` words drawn uniformly from the vocabulary, with a full stop every 12th word.
    Drawn in one `choices` call: a word at a time was a third of a simulated summarize
    capacity search's time (and the load client's, on the cores the engine shares)."""
    out = rng.choices(_WORDS, k=max(0, n))
    for i in range(11, len(out), 12):
        out[i] += "."
    return " ".join(out)


def uniform(rng: random.Random, lo: int, hi: int, *, scale: float = 1.0) -> int:
    """An integer uniform in [lo, hi], scaled (at least 1)."""
    return max(1, round(rng.randint(lo, hi) * scale))


@dataclass(frozen=True)
class Request:
    """One HTTP request of a workload: `path` is /v1/completions or /v1/chat/completions;
    `body` holds the OpenAI fields except model/stream, which the client adds."""

    kind: str
    path: str
    body: dict


class Session(Protocol):
    """A user's unit of work: one request (single-shot kinds) or a conversation.

    `context` is the served model's context length in tokens (the server's max_model_len,
    /v1/models), set by the driver when it knows it (WorkloadSpec.start_session): a
    multi-turn session keeps its history inside it (ContextBudget)."""

    kind: str
    context: int | None

    def next_request(self) -> Request | None:
        """The next request, or None when the session is over."""

    def record_response(self, text: str, prompt_tokens: int | None = None) -> None:
        """Feed the generated text back (chat appends it to the history), with the request's
        prompt tokens as the server counted them (usage.prompt_tokens; None: unknown, as
        after a failed request)."""


class ContextBudget:
    """What a multi-turn session knows of the tokens its history costs: the model's context
    length and its last served prompt's tokens per character. A history's tokens are
    estimated at that ratio (the session's own text, in the model's own tokenizer and chat
    template, as the server counted it), so a session can stop before a request the server
    would refuse (prompt + max_tokens past max_model_len: HTTP 400), as an agent or a chat
    client that tracks its token usage does. Without a context, or before a first reply,
    everything fits: the workloads' word limits alone apply."""

    MARGIN = 1.05  # on the estimate: new text may cost a little more per character

    def __init__(self) -> None:
        self.context: int | None = None
        self._ratio: float | None = None   # tokens per character of the last prompt
        self._sent_chars = 0

    def sent(self, chars: int) -> None:
        """A request of `chars` characters of message content went out."""
        self._sent_chars = chars

    def served(self, prompt_tokens: int | None) -> None:
        """Its prompt cost `prompt_tokens` (None: no count came back; the ratio stays)."""
        if prompt_tokens and self._sent_chars:
            self._ratio = prompt_tokens / self._sent_chars

    def fits(self, chars: int, more_tokens: int) -> bool:
        """Whether a history of `chars` characters plus `more_tokens` tokens fits."""
        if self.context is None or self._ratio is None:
            return True
        return self.MARGIN * self._ratio * chars + more_tokens <= self.context


class BudgetedSession:
    """A multi-turn session whose `context` (Session.context) is its `budget`'s."""

    budget: ContextBudget

    @property
    def context(self) -> int | None:
        return self.budget.context

    @context.setter
    def context(self, tokens: int | None) -> None:
        self.budget.context = tokens


class SingleShot:
    """A session of exactly one request."""

    context: int | None = None  # one request: nothing to plan

    def __init__(self, request: Request) -> None:
        self.kind = request.kind
        self._request: Request | None = request

    def next_request(self) -> Request | None:
        request, self._request = self._request, None
        return request

    def record_response(self, text: str, prompt_tokens: int | None = None) -> None:
        pass


# Open loop: an arrival continues one of the user's waiting multi-turn sessions (chosen at
# random) with this probability, else starts a new one (loadtests/common.py's Locust user
# and the simulator's arrival process, tuner/sim/stream.py, both follow it: OpenLoop). A
# session waits only while it has a turn left (`park`), so the share of arrivals that
# continue a session settles at the workload's own, (turns - 1) / turns (chat 0.75,
# agentic 0.78), and the number waiting stays small, provided this probability is above
# that share: at 0.7 chat's sessions piled up without end (0.9 continuations owed per
# arrival, 0.7 paid) and its capacity fell with every request served before the window.
REVISIT_IDLE_SESSION = 0.9


def park(idle: list, session: Session) -> None:
    """After a reply: the session waits in `idle` with its next request, drawn now (it
    depends on the history alone), or leaves for good when it has none."""
    request = session.next_request()
    if request is not None:
        idle.append((session, request))


class OpenLoop:
    """One user's open-loop arrivals: Poisson gaps at `rate` and, per arrival, whether it
    continues a waiting session and which one.

    The gaps and the choices come from two generators, and every arrival draws the same
    numbers whatever waits, so the arrival times are a function of (seed, user, rate)
    alone: how fast the server replied (which sessions wait) changes which session an
    arrival continues, never when it arrives. Two settings, rounds or probes of one seed
    therefore see the same arrivals (common random numbers), and a faster server does not
    shift the stream it is measured on.
    """

    def __init__(self, seed: int, user: int, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"the arrival rate must be > 0 requests/s, got {rate}")
        self.rate = rate
        self._gaps = random.Random(seed * 7919 + user)
        self._choices = random.Random(seed * 7919 + user + 1_000_003)

    def gap(self) -> float:
        """Seconds until the next arrival."""
        return self._gaps.expovariate(self.rate)

    def pick(self, idle: list):
        """The waiting (session, request) this arrival sends (removed from `idle`, which
        `park` fills), or None: start a new session."""
        revisit, which = self._choices.random(), self._choices.random()
        if idle and revisit < REVISIT_IDLE_SESSION:
            return idle.pop(int(which * len(idle)))
        return None

# SLO thresholds, seconds: ttft = time to first token; tpot = a request's mean gap between
# output tokens (DistServe's TPOT); e2e = end-to-end latency of the whole response.
SLO_NAMES = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class WorkloadSpec:
    """What the tuner needs to know about a workload.

    `slos` maps a request kind to its thresholds ({"chat": {"ttft": 1.0, "tpot": 0.1}});
    a mixed workload has several kinds. `primary_latency` names the latency the Pareto
    mode trades against throughput. `users` is the default closed-loop concurrency.
    `tune_also` names engine settings (the settings table's) whose tuner ranges join the
    default search space for this workload only (kv_offloading_size: requests come back to
    long prefixes, which a host KV tier keeps after the device pool evicts them).
    """

    name: str
    description: str
    new_session: Callable[[random.Random, float], Session]
    slos: dict[str, dict[str, float]]
    primary_latency: str = "e2e"
    users: int = 4
    extra: dict = field(default_factory=dict)
    tune_also: tuple[str, ...] = ()

    def start_session(self, user_rng: random.Random, scale: float = 1.0,
                      context: int | None = None) -> Session:
        """A user's next session, on a generator of its own drawn from the user's: a user's
        k-th session is the same conversation whichever of its sessions ran in between
        (an open loop interleaves them in the order the server's speed decides), so every
        rate, probe and setting of one seed replays the same sessions. `context`: the
        model's max_model_len, when known (Session.context)."""
        session = self.new_session(random.Random(user_rng.getrandbits(64)), scale)
        session.context = context
        return session

    def __post_init__(self) -> None:
        for kind, slo in self.slos.items():
            unknown = set(slo) - set(SLO_NAMES)
            if unknown:
                raise ValueError(f"workload {self.name}: unknown SLO {sorted(unknown)} "
                                 f"for kind {kind}; use {SLO_NAMES}")
