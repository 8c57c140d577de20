"""summarize: long prompts, short outputs.

Request stream (lengths in words at --length-scale 1):
- a fresh document of 600-1200 words (uniform) followed by a one-line instruction;
  no two requests share more than the instruction, so there is no prefix reuse;
- the summary asks for 16-48 tokens (uniform, EOS ignored).
Endpoint: /v1/completions, streamed.
Default SLO: end-to-end latency <= 6.0 s.
Default load: 4 closed-loop users.
"""
from __future__ import annotations

import random

from loadtests.workloads.base import Request, SingleShot, WorkloadSpec, uniform, words

DOC_WORDS = (600, 1200)
SUMMARY_TOKENS = (16, 48)


def new_session(rng: random.Random, scale: float = 1.0) -> SingleShot:
    doc = words(rng, uniform(rng, *DOC_WORDS, scale=scale))
    prompt = f"Document:\n{doc}\n\nSummarize the document above in a few sentences.\nSummary:"
    return SingleShot(Request("summarize", "/v1/completions", {
        "prompt": prompt, "max_tokens": uniform(rng, *SUMMARY_TOKENS, scale=scale)}))


WORKLOAD = WorkloadSpec(
    name="summarize",
    description="long documents, short summaries",
    new_session=new_session,
    slos={"summarize": {"e2e": 6.0}},
    primary_latency="e2e",
    users=4,
)
