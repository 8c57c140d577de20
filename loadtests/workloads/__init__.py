"""Workload definitions (no Locust import): `get_workload(name)` returns a WorkloadSpec."""
from __future__ import annotations

import importlib

from loadtests.workloads.base import Request, Session, WorkloadSpec
from paged_api.workloads import TRACE_WORKLOAD, WORKLOAD_NAMES

__all__ = ["TRACE_WORKLOAD", "WORKLOAD_NAMES", "Request", "Session", "WorkloadSpec",
           "get_workload"]


def get_workload(name: str) -> WorkloadSpec:
    """The spec of workload `name`; ValueError naming the choices when unknown."""
    if name not in (*WORKLOAD_NAMES, TRACE_WORKLOAD):
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOAD_NAMES)}")
    return importlib.import_module(f"loadtests.workloads.{name}").WORKLOAD
