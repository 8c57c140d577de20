"""Locust entry point for the `summarize` workload (generator: loadtests/workloads/summarize.py).

Length distributions, default SLOs and default load are documented once, in
loadtests/workloads/summarize.py.

By hand: locust -f loadtests/summarize.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.summarize import WORKLOAD


class SummarizeUser(StreamingUser):
    workload = WORKLOAD
