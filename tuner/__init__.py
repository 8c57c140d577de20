"""Autotuning benchmark harness: Optuna sweeps of engine settings scored by Locust load
and Prometheus metrics; the winner comes out as a PagedInferenceService patch.

Entry point: `python -m tuner sweep|report|bench` (tuner/README.md).
"""
