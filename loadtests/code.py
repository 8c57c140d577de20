"""Locust entry point for the `code` workload (generator: loadtests/workloads/code.py).

code: medium prompts behind a shared few-shot header; tight TTFT.

Request stream (lengths in words at --length-scale 1):
- a few-shot header of 8 small code examples (~250 words), identical for every request
  (prefix reuse across all requests);
- a task description of 50-150 words (uniform) and a function signature;
- the completion asks for 32-128 tokens (uniform, EOS ignored).
Endpoint: /v1/completions, streamed.
Default SLOs: TTFT <= 0.5 s (tight: an editor waits on it) and TPOT <= 0.1 s.
Default load: 6 closed-loop users.

By hand: locust -f loadtests/code.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.code import WORKLOAD


class CodeUser(StreamingUser):
    workload = WORKLOAD
