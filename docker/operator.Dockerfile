# The operator image: kopf, the kubernetes client, the paged_operator package and the
# API package (no torch).
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
# The API package (torch-free, importing nothing else of the project): the settings table
# behind spec.engine and spec.kvCache, the search-space grammar and the tuning contract
# that the operator parses a PagedInferenceTuning with, the workload names.
COPY api/paged_api /app/paged_api
RUN python -m compileall -q /app/paged_operator /app/paged_api

# The chart runs it as UID 1000 with a read-only root filesystem (/tmp is an emptyDir).
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /tmp operator
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["python", "-m", "paged_operator"]
CMD ["--liveness=http://0.0.0.0:8080/healthz"]
