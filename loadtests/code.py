"""Locust entry point for the `code` workload (generator: loadtests/workloads/code.py).

Length distributions, default SLOs and default load are documented once, in
loadtests/workloads/code.py.

By hand: locust -f loadtests/code.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.code import WORKLOAD


class CodeUser(StreamingUser):
    workload = WORKLOAD
