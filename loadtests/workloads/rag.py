"""rag: a handful of shared documents prepended in varying combinations.

Request stream (lengths in words at --length-scale 1):
- a corpus of 6 documents of 250 words each, fixed for all users;
- each request prepends 2 or 3 distinct documents in a random order (so requests share
  prefixes of one or more whole documents, depending on the order), then a question of
  10-30 words (uniform);
- the answer asks for 32-64 tokens (uniform, EOS ignored).
Endpoint: /v1/completions, streamed.
Default SLOs: TTFT <= 1.5 s and end-to-end latency <= 6.0 s.
Default load: 6 closed-loop users.
"""
from __future__ import annotations

import functools
import random

from loadtests.workloads.base import Request, SingleShot, WorkloadSpec, uniform, words

NUM_DOCS = 6
DOC_WORDS = 250
DOCS_PER_REQUEST = (2, 3)
QUESTION_WORDS = (10, 30)
ANSWER_TOKENS = (32, 64)
_CORPUS_SEED = 99


@functools.lru_cache(maxsize=16)
def corpus(scale: float = 1.0) -> tuple[str, ...]:
    """The same documents every time for a scale: drawn once (drawing 1,500 words for
    every request was 40 % of a simulated rag capacity search's time, and the load
    client's time on the cores the engine shares)."""
    rng = random.Random(_CORPUS_SEED)
    return tuple(f"[doc {i}] " + words(rng, max(1, round(DOC_WORDS * scale)))
                 for i in range(NUM_DOCS))


def new_session(rng: random.Random, scale: float = 1.0) -> SingleShot:
    docs = corpus(scale)
    chosen = rng.sample(range(NUM_DOCS), rng.randint(*DOCS_PER_REQUEST))
    context = "\n\n".join(docs[i] for i in chosen)
    question = words(rng, uniform(rng, *QUESTION_WORDS, scale=scale))
    prompt = f"{context}\n\nAnswer using the documents above.\nQuestion: {question}?\nAnswer:"
    return SingleShot(Request("rag", "/v1/completions", {
        "prompt": prompt, "max_tokens": uniform(rng, *ANSWER_TOKENS, scale=scale)}))


WORKLOAD = WorkloadSpec(
    name="rag",
    description="shared documents in varying combinations + short questions",
    new_session=new_session,
    slos={"rag": {"ttft": 1.5, "e2e": 6.0}},
    primary_latency="ttft",
    users=6,
    tune_also=("kv_offloading_size",),  # revisits long prefixes (a host KV tier)
)
