"""Locust entry point for the `rag` workload (generator: loadtests/workloads/rag.py).

Length distributions, default SLOs and default load are documented once, in
loadtests/workloads/rag.py.

By hand: locust -f loadtests/rag.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.rag import WORKLOAD


class RagUser(StreamingUser):
    workload = WORKLOAD
