"""The GPU benchmark's pieces that can be checked without a GPU (its numbers need one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paged_kernels import bench

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed on machines without CUDA")
def test_exits_with_a_clear_message_without_cuda():
    done = subprocess.run([sys.executable, "-m", "paged_kernels.bench", "--batch", "1"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and done.stdout == ""


def test_peak_bandwidth_lookup_prefers_the_specific_name():
    assert bench.peak_gbps("NVIDIA H200") == 4800
    assert bench.peak_gbps("NVIDIA GH200 480GB") == 4000  # not taken for an H200
    assert bench.peak_gbps("NVIDIA A100-SXM4-80GB") == 2039
    assert bench.peak_gbps("Some Future GPU") is None


def test_bytes_model_counts_kv_once():
    n = bench.decode_bytes(batch=2, context=64, num_heads=4, num_kv_heads=2, head_dim=8, block_size=16, elem_bytes=2)
    assert n == 2 * 2 * 64 * 2 * 8 * 2 + 2 * 2 * 4 * 8 * 2 + 2 * 4 * 4


def test_bad_grid_argument_is_rejected():
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--batch", "1,x"])


def test_shuffled_pool_gives_the_contiguous_answer(device):
    # The bench's own correctness column: paged over shuffled blocks == SDPA over contiguous K/V.
    args = bench.build_parser().parse_args(["--block-size", "8,16,24", "--num-heads", "4", "--num-kv-heads", "2",
                                            "--head-dim", "32"])
    rows = bench.bench_shape(args, batch=3, context=48, dtype=torch.float32, peak=100.0, device=device,
                             timer=lambda fn: (fn(), 10.0)[1])
    assert [r[2] for r in rows] == ["contiguous (SDPA)", "8", "16", "24"]
    assert all(float(r[-1]) < 1e-4 for r in rows[1:])
    assert rows[1][5].endswith("%") and float(rows[1][6]) == 1.0  # same fake time: ratio 1
