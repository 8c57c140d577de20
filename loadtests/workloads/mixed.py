"""mixed: a weighted mix of the other workloads.

Each new session is drawn by weight: chat 40 %, summarize 20 %, code 20 %, rag 20 %
(a chat session is several requests, so chat's share of requests is higher). Each
request keeps its own kind's lengths (see the other modules) and is judged by its own
kind's SLOs. Default load: 8 closed-loop users.
"""
from __future__ import annotations

import random

from loadtests.workloads import chat, code, rag, summarize
from loadtests.workloads.base import Session, WorkloadSpec

# (spec, weight) pairs; weights are per session.
MIX = ((chat.WORKLOAD, 0.4), (summarize.WORKLOAD, 0.2), (code.WORKLOAD, 0.2), (rag.WORKLOAD, 0.2))


def new_session(rng: random.Random, scale: float = 1.0) -> Session:
    spec = rng.choices([s for s, _ in MIX], weights=[w for _, w in MIX])[0]
    return spec.new_session(rng, scale)


WORKLOAD = WorkloadSpec(
    name="mixed",
    description="weighted mix of chat, summarize, code and rag",
    new_session=new_session,
    slos={k: v for spec, _ in MIX for k, v in spec.slos.items()},
    primary_latency="e2e",
    users=8,
)
