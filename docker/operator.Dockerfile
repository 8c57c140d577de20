# The operator image: kopf, the kubernetes client, the paged_operator package and the
# engine's settings table (no torch).
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t pagedinference/operator:0.1.0 .
FROM python:3.11-slim AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app

# kopf (with aiohttp and pyyaml) watches; the official kubernetes client makes every
# other API call. Nothing else: no torch.
RUN pip install "kopf>=1.45,<2" "kubernetes>=33"

WORKDIR /app
COPY operator/paged_operator /app/paged_operator
# The engine's settings table and the search-space grammar over it (torch-free):
# spec.engine parsing, the flag mapping and paged_operator/contract.py's reading of a
# PagedInferenceTuning use them. engine/__init__.py imports the engine lazily, so only
# these files are needed.
COPY engine/__init__.py engine/settings.py engine/settings_k8s.py engine/search_space.py /app/engine/
COPY engine/settings_types.py engine/settings_speculative.py /app/engine/
# The workload names a PagedInferenceTuning may give (torch-free).
COPY loadtests/__init__.py /app/loadtests/
COPY loadtests/workloads/__init__.py loadtests/workloads/base.py /app/loadtests/workloads/
RUN python -m compileall -q /app/paged_operator /app/engine /app/loadtests

# The chart runs it as UID 1000 with a read-only root filesystem (/tmp is an emptyDir).
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /tmp operator
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["python", "-m", "paged_operator"]
CMD ["--liveness=http://0.0.0.0:8080/healthz"]
