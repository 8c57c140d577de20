"""Locust entry point for the `agentic` workload (generator: loadtests/workloads/agentic.py).

Length distributions, default SLOs and default load are documented once, in
loadtests/workloads/agentic.py.

By hand: locust -f loadtests/agentic.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.agentic import WORKLOAD


class AgenticUser(StreamingUser):
    workload = WORKLOAD
