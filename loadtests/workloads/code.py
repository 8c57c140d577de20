"""code: medium prompts behind a shared few-shot header; tight TTFT.

Request stream (lengths in words at --length-scale 1):
- a few-shot header of 8 small code examples (~250 words), identical for every request
  (prefix reuse across all requests);
- a task description of 50-150 words (uniform) and a function signature;
- the completion asks for 32-128 tokens (uniform, EOS ignored), greedy (temperature 0:
  an editor's completion is the model's most likely code, and one that repeats).
Endpoint: /v1/completions, streamed.
Default SLOs: TTFT <= 0.5 s (tight: an editor waits on it) and TPOT <= 0.1 s.
Default load: 6 closed-loop users.
"""
from __future__ import annotations

import functools
import random

from loadtests.workloads.base import Request, SingleShot, WorkloadSpec, uniform, words

EXAMPLES = 8
TASK_WORDS = (50, 150)
COMPLETION_TOKENS = (32, 128)
_HEADER_SEED = 7


def _identifier(rng: random.Random) -> str:
    return "_".join(words(rng, 2).replace(".", "").split())


def _example(rng: random.Random) -> str:
    name, a, b = _identifier(rng), _identifier(rng), _identifier(rng)
    doc = words(rng, 12).replace(".", "")
    return (f"def {name}({a}, {b}):\n    \"\"\"{doc}\"\"\"\n"
            f"    total = {a} + {b} * {rng.randint(2, 9)}\n"
            f"    return total if total > {rng.randint(0, 99)} else {a}\n")


@functools.lru_cache(maxsize=16)
def header(scale: float = 1.0) -> str:
    """The same few-shot header every time for a scale: drawn once per scale."""
    rng = random.Random(_HEADER_SEED)
    n = max(1, round(EXAMPLES * scale))
    return "# Examples of the house style.\n\n" + "\n".join(_example(rng) for _ in range(n))


def new_session(rng: random.Random, scale: float = 1.0) -> SingleShot:
    task = words(rng, uniform(rng, *TASK_WORDS, scale=scale))
    prompt = f"{header(scale)}\n# Task: {task}\ndef {_identifier(rng)}(data):\n"
    return SingleShot(Request("code", "/v1/completions", {
        "prompt": prompt, "max_tokens": uniform(rng, *COMPLETION_TOKENS, scale=scale),
        "temperature": 0.0}))


WORKLOAD = WorkloadSpec(
    name="code",
    description="shared few-shot header + medium tasks, tight TTFT",
    new_session=new_session,
    slos={"code": {"ttft": 0.5, "tpot": 0.1}},
    primary_latency="ttft",
    users=6,
)
