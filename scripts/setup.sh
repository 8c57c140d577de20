#!/usr/bin/env bash
# One-shot set-up on a fresh machine: CPU torch first (so nothing pulls a CUDA build),
# then the project with its test extras, then kubectl and helm for the chart tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e '.[test]'
bash scripts/install-k8s-tools.sh
