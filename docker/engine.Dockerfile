# The engine image the operator deploys: `python -m engine serve` on CUDA; the router's
# pods (spec.router) run the same image as `python -m paged_router`.
# Build from the repository root:
#   docker build -f docker/engine.Dockerfile -t pagedinference/engine:0.1.0 .
# torch wheels from the CUDA index bundle the CUDA runtime, so a slim base suffices;
# the node needs only the NVIDIA driver (and the device plugin for nvidia.com/gpu).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from the CUDA index, so the project's `torch` requirement is already met.
RUN pip install --index-url "${TORCH_INDEX_URL}" torch
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY api ./api
COPY kernels ./kernels
COPY tuner ./tuner
COPY loadtests ./loadtests
COPY operator ./operator
COPY router ./router
RUN pip install ".[triton]"

FROM python:${PYTHON_VERSION}-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HOME=/model-cache/huggingface \
    TRITON_CACHE_DIR=/tmp/.triton
COPY --from=build /opt/venv /opt/venv
# Triton compiles kernels at run time and needs a C compiler for its launcher stubs.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp engine \
    && mkdir -p /model-cache && chown 1000:1000 /model-cache
USER 1000:1000
WORKDIR /tmp
EXPOSE 8000
# The operator passes the model and flags as args; this default serves a small model.
ENTRYPOINT ["python", "-m", "engine", "serve"]
CMD ["Qwen/Qwen2.5-0.5B-Instruct", "--host", "0.0.0.0", "--port", "8000"]
