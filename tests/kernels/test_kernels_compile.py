"""The Triton kernels compile for real GPUs (to cubin, with triton's bundled ptxas), no GPU needed.

The interpreter runs kernels as Python, so it misses what only the compiler checks (types
carried through loops, constexpr branches, layouts of tl.dot operands). This compiles the
launch variants the backend uses, in a subprocess where TRITON_INTERPRET is unset.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from paged_kernels import triton_attention as ta, triton_cache as tc

def compile_for(arch, fn, pointers, constexprs, index="i32"):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        else:  # strides, counts, the window: integers; the scale: a float
            sig[name] = "fp32" if name == "scale" else "i32"
    kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", arch, 32))
    return kernel.metadata.shared

results = []
for dt, head_dim, tokens, seqs, splits, window, index, arch in [
    ("fp16", 128, 32, 32, 1, False, "i32", 90),   # decode, Llama-style GQA 32/8
    ("bf16", 80, 40, 4, 4, True, "i64", 90),      # prefill + decode, split-KV, window, int64 indices
    ("fp32", 256, 8, 8, 1, False, "i32", 80),     # fp32 exact dots, widest head, A100
]:
    config = ta.launch_config(num_tokens=tokens, num_seqs=seqs, num_heads=32, num_kv_heads=8, head_dim=head_dim)
    pointers = dict(out_ptr="*fp32" if splits > 1 else f"*{dt}", lse_ptr="*fp32", q_ptr=f"*{dt}",
                    k_cache_ptr=f"*{dt}", v_cache_ptr=f"*{dt}", cu_seqlens_q_ptr=f"*{index}",
                    seq_lens_ptr=f"*{index}", block_tables_ptr=f"*{index}")
    consts = dict(BLOCK_SIZE=16, SPLIT_KV=splits > 1, USE_WINDOW=window, FP32_DOT=dt == "fp32", **config)
    results.append(compile_for(arch, ta._paged_attention_kernel, pointers, consts))
results.append(compile_for(90, ta._merge_splits_kernel, dict(out_ptr="*bf16", partial_ptr="*fp32", lse_ptr="*fp32"),
                           dict(HEAD_DIM=80, HEAD_DIM_P=128, SPLITS_P=16)))
results.append(compile_for(90, tc._reshape_and_cache_kernel,
                           dict(key_ptr="*fp16", value_ptr="*fp16", k_cache_ptr="*fp16", v_cache_ptr="*fp16",
                                slot_mapping_ptr="*i64"), dict(BLOCK_SIZE=16, HEAD_DIM=96, HEAD_DIM_P=128)))
results.append(compile_for(90, tc._copy_blocks_kernel,
                           dict(k_cache_ptr="*bf16", v_cache_ptr="*bf16", block_mapping_ptr="*i64"),
                           dict(NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_NUMEL=16 * 8 * 128, CHUNK=4096)))
print(json.dumps(results))
"""


def test_kernels_compile_for_hopper_and_ampere():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    shared = [int(x) for x in done.stdout.strip().splitlines()[-1].strip("[]").split(",")]
    assert len(shared) == 6
    assert max(shared[:3]) < 228 * 1024  # attention tiles fit Hopper's shared memory
