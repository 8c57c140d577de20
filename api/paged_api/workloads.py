"""The workload names a PagedInferenceTuning (spec.workload) and `python -m tuner sweep
--workload` accept; their definitions are loadtests/workloads/, which the operator does not
need."""
from __future__ import annotations

WORKLOAD_NAMES = ("chat", "summarize", "code", "rag", "mixed", "agentic")  # the synthetic workloads
TRACE_WORKLOAD = "trace"  # replays a trace file (loadtests/workloads/trace.py)
