"""Locust entry point for the `rag` workload (generator: loadtests/workloads/rag.py).

rag: a handful of shared documents prepended in varying combinations.

Request stream (lengths in words at --length-scale 1):
- a corpus of 6 documents of 250 words each, fixed for all users;
- each request prepends 2 or 3 distinct documents in a random order (so requests share
  prefixes of one or more whole documents, depending on the order), then a question of
  10-30 words (uniform);
- the answer asks for 32-64 tokens (uniform, EOS ignored).
Endpoint: /v1/completions, streamed.
Default SLOs: TTFT <= 1.5 s and end-to-end latency <= 6.0 s.
Default load: 6 closed-loop users.

By hand: locust -f loadtests/rag.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.rag import WORKLOAD


class RagUser(StreamingUser):
    workload = WORKLOAD
