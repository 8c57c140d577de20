"""A stand-in for the `engine` package in the local cluster's tuning tests.

A PagedInferenceService whose spec.env sets PYTHONPATH to this folder runs this instead of
the real engine: the operator's `python -m engine serve ...` finds this package first. See
engine/__main__.py.
"""
