"""Locust entry point for the `chat` workload (generator: loadtests/workloads/chat.py).

Length distributions, default SLOs and default load are documented once, in
loadtests/workloads/chat.py.

By hand: locust -f loadtests/chat.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.chat import WORKLOAD


class ChatUser(StreamingUser):
    workload = WORKLOAD
