#!/usr/bin/env bash
# The GPU checks as one prepared run (at most 9 minutes: one device call), for a machine
# with CUDA, torch and triton already installed (nothing is installed here):
#   1. the kernel parity suite, compiled on CUDA instead of interpreted, and the engine's
#      greedy parity with transformers running on the GPU through the Triton backend;
#   2. the KV host tier's CUDA transfer (tests/engine/test_kv_offload.py -k cuda);
#   3. python -m paged_kernels.bench over the full grid, with a time budget.
# Results land in $OUT (default ./gpu-check): env.txt, tests.log, bench.md, bench.log.
# Usage: bash scripts/gpu_check.sh      (from the repository root)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/api:$PWD/operator:$PWD/kernels:$PWD/router${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
# tests/conftest.py imports the operator (kopf, kubernetes) unless this is set; these checks
# need neither, and a GPU image rarely has them.
export PAGED_OPERATOR_RESYNC_SECONDS=${PAGED_OPERATOR_RESYNC_SECONDS:-5}

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.txt"

# The transformers probe test checks this project's pip metadata, which a bare checkout lacks.
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -n 8 -k "not transformers_probe" \
  tests/kernels tests/engine/test_greedy_parity.py 2>&1 | tee "$OUT/tests.log" | tail -25
echo "tests: exit ${PIPESTATUS[0]}"

# The KV host tier's CUDA transfer (side stream, pinned memory): engine/kv_offload/transfer.py.
timeout 90 "$PY" -m pytest -q -p no:cacheprovider tests/engine/test_kv_offload.py -k cuda \
  2>&1 | tee "$OUT/kv_offload.log" | tail -5
echo "kv tiers: exit ${PIPESTATUS[0]}"

timeout 200 "$PY" -m paged_kernels.bench --budget-s 150 --out "$OUT/bench.md" 2>&1 | tee "$OUT/bench.log"
echo "bench: exit ${PIPESTATUS[0]}"
