"""Locust entry point for the `summarize` workload (generator: loadtests/workloads/summarize.py).

summarize: long prompts, short outputs.

Request stream (lengths in words at --length-scale 1):
- a fresh document of 600-1200 words (uniform) followed by a one-line instruction;
  no two requests share more than the instruction, so there is no prefix reuse;
- the summary asks for 16-48 tokens (uniform, EOS ignored).
Endpoint: /v1/completions, streamed.
Default SLO: end-to-end latency <= 6.0 s.
Default load: 4 closed-loop users.

By hand: locust -f loadtests/summarize.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.summarize import WORKLOAD


class SummarizeUser(StreamingUser):
    workload = WORKLOAD
