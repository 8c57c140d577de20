"""Locust entry point for the `mixed` workload (generator: loadtests/workloads/mixed.py).

mixed: a weighted mix of the other workloads.

Each new session is drawn by weight: chat 40 %, summarize 20 %, code 20 %, rag 20 %
(a chat session is several requests, so chat's share of requests is higher). Each
request keeps its own kind's lengths (see the other modules) and is judged by its own
kind's SLOs. Default load: 8 closed-loop users.

By hand: locust -f loadtests/mixed.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.mixed import WORKLOAD


class MixedUser(StreamingUser):
    workload = WORKLOAD
