"""A prefix-cache-aware router in front of several engine replicas.

`python -m paged_router --backends URL,URL` (or `--discover SERVICE` in Kubernetes).
Nothing here imports torch or transformers: the router needs no model files.
"""
