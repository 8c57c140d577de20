"""Locust workloads for the paged-KV engine.

`loadtests/<name>.py` are Locust locustfiles (chat, summarize, code, rag, mixed, agentic);
`loadtests/workloads/` holds their seeded prompt generators and default SLOs as plain
Python, so the tuner can read SLOs without importing Locust (which monkey-patches the
interpreter with gevent on import).
"""
