"""The launch-parameter tuner's pieces that can be checked without a GPU (its numbers need one): the
kernel's override argument, the coordinate descent, and one tiny sweep under the interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paged_attention_cases import TOLERANCE, make_case

from paged_kernels import reference, tune

REPO = Path(__file__).resolve().parents[2]

torch.set_num_threads(1)


@pytest.fixture
def triton_attention():
    from paged_kernels import triton_attention

    return triton_attention


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed on machines without CUDA")
def test_exits_with_a_clear_message_without_cuda():
    done = subprocess.run([sys.executable, "-m", "paged_kernels.tune", "--budget-s", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "paged_kernels.tune needs a CUDA GPU" in done.stderr and done.stdout == ""


def _spy_launches(monkeypatch, ta) -> list[dict]:
    """Record the keyword arguments of every attention-kernel launch."""
    kernel, seen = ta._paged_attention_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(dict(kwargs, grid=grid))
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(ta, "_paged_attention_kernel", Spy())
    return seen


def test_overrides_reach_the_launch_and_keep_the_answer(triton_attention, device, monkeypatch):
    ta = triton_attention
    case = make_case(q_lens=[1, 1, 3], seq_lens=[70, 9, 40], block_size=16, num_heads=8, num_kv_heads=2).to(device)
    twin = reference.paged_attention_ref(case.query, case.key_cache, case.value_cache, **case.kwargs())
    seen = _spy_launches(monkeypatch, ta)
    plain = ta.paged_attention(case.query, case.key_cache, case.value_cache, **case.kwargs())
    forced = ta.paged_attention(case.query, case.key_cache, case.value_cache, **case.kwargs(),
                                overrides={"TILE_N": 16, "num_splits": 3, "num_warps": 2, "num_stages": 1})
    tol = TOLERANCE[torch.float32]
    torch.testing.assert_close(plain, twin, atol=tol, rtol=tol)
    torch.testing.assert_close(forced, twin, atol=tol, rtol=tol)
    # Without overrides: Triton's num_warps, the kernel's own pipelining depth.
    assert "num_warps" not in seen[0] and seen[0]["num_stages"] == ta.NUM_STAGES == 2
    assert seen[0]["TILE_N"] == 64
    assert (seen[1]["TILE_N"], seen[1]["num_warps"], seen[1]["num_stages"], seen[1]["grid"][2]) == (16, 2, 1, 3)


@pytest.mark.parametrize("overrides, named", [
    ({"TILE_N": 24}, "TILE_N"), ({"TILE_N": 8}, "TILE_N"), ({"BLOCK_K": 16}, "BLOCK_K"),
    ({"num_warps": 3}, "num_warps"), ({"num_stages": 0}, "num_stages"), ({"num_splits": 2.0}, "num_splits"),
])
def test_bad_overrides_raise_naming_the_key(triton_attention, overrides, named):
    case = make_case(q_lens=[1], seq_lens=[5], block_size=4)
    with pytest.raises(ValueError, match=named):
        triton_attention.paged_attention(case.query, case.key_cache, case.value_cache, **case.kwargs(),
                                         overrides=overrides)


def test_num_splits_cannot_be_given_twice(triton_attention):
    case = make_case(q_lens=[1], seq_lens=[5], block_size=4)
    with pytest.raises(ValueError, match="num_splits"):
        triton_attention.paged_attention(case.query, case.key_cache, case.value_cache, **case.kwargs(), num_splits=2,
                                         overrides={"num_splits": 4})


def test_coordinate_descent_finds_a_separable_optimum_and_stops_on_time():
    axes = {"a": [1, 2, 4, 8], "b": [16, 32, 64]}
    calls = []

    def measure(c):
        calls.append(c)
        return 100 + (c["a"] - 4) ** 2 + (c["b"] - 32) ** 2 / 16

    best, complete = tune.coordinate_descent({"a": 1, "b": 64}, axes, measure, out_of_time=lambda: False)
    assert best == {"a": 4, "b": 32} and complete
    assert len(calls) == len({tuple(sorted(c.items())) for c in calls})  # each config once
    calls.clear()
    best, complete = tune.coordinate_descent({"a": 1, "b": 64}, axes, measure, out_of_time=lambda: True)
    assert best == {"a": 1, "b": 64} and not complete and calls == [{"a": 1, "b": 64}]  # the start only


def test_tiny_sweep_checks_every_config(device):
    # Constant fake times: no move clears MIN_GAIN, so one round of every axis, each config checked against SDPA.
    r = tune.tune_shape(2, 48, peak=100.0, deadline=float("inf"), num_heads=4, num_kv_heads=2, head_dim=16,
                        dtype=torch.float32, device=device, timer=lambda fn: (fn(), 10.0)[1])
    assert r["complete"] and r["best"] == r["default"] and r["default"]["num_splits"] == 1
    assert len(r["tried"]) == 1 + 4 + 3 + 2 + 3  # default, then the other values of each axis
    assert all(e["status"] == "ok" and e["max_abs_diff"] <= r["allowed"] for e in r["tried"])
    assert len(tune.shape_table(r)) == 4 + len(r["tried"]) + 1
    assert "(default)" in tune.summary_row(r)
    line = json.loads(tune.to_json(r, {"gpu": "cpu"}))
    assert line["speedup_vs_default"] == 1.0 and len(line["tried"]) == len(r["tried"])


@pytest.mark.parametrize("sms, active, context, splits", [
    (132, 256, 2048, 2),      # batch 32 on an H200: 2 (four programs per SM asked for 3)
    (132, 256, 32768, 2),
    (132, 512, 2048, 1),      # batch 64: the grid fills the SMs twice over already
    (132, 264, 8192, 1),      # exactly two programs per SM: no split
    (132, 64, 32768, 8),      # 4.1 programs wanted per SM -> the next power of two
    (132, 64, 2048, 4),       # ... but no split under MIN_CHUNK_PER_SPLIT tokens
    (132, 8, 65536, 64),      # one sequence: at most 64
    (132, 8, 300, 1),
])
def test_the_split_count_aims_at_two_programs_per_sm_in_powers_of_two(triton_attention, sms, active,
                                                                    context, splits):
    assert triton_attention.splits_for(sms, active, context) == splits
