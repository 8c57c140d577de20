"""Launch-parameter sweep for the Triton paged-attention kernel at decode shapes (CUDA only).

    python -m paged_kernels.tune [--budget-s 200] [--shapes 32x2048,64x2048] [--peak-gbps 4800] [--out FILE.md]

The kernel's launch parameters (launch_config's TILE_N, Triton's num_warps, the kernel's
NUM_STAGES, the split count of splits_for) were tuned with this on an H200 (kernels/
tune-h200.md). It times alternatives at the shapes where the decode benchmark missed its
targets (bf16, 32 query / 8 kv heads, head_dim 128, one query per sequence, block size 16),
on the benchmark's own inputs: its shuffled block pool, its CUDA-graph timer and its SDPA run
on contiguous K/V as both reference and speed bar.

Search: coordinate descent from the default launch, one parameter at a time in the order
num_splits {1, 2, 4, 8, 16, the default pick}, TILE_N {16, 32, 64, 128}, num_warps {2, 4, 8},
num_stages {1, 2, 3, 4}, each swept with the others held at the best so far; the rounds repeat
(splits again with the new tiles, ...) until one changes nothing or MAX_ROUNDS. A move needs a
MIN_GAIN improvement, so timing noise does not walk away from the default. Each config is
timed once per shape; the default and the winner are re-timed back to back at the end, and
the summary's speedup is from that pair. The full grid (240 to 288 configs per shape, each a
compile plus a timing) would not fit a few minutes; splits and tiles interact most, hence the
repeated rounds.

Correctness: every config's output is compared with SDPA's before it is timed and rejected if
its max abs difference exceeds TOLERANCE x the largest |output| (the kernel tests' bf16
tolerance, relative because outputs shrink as contexts grow: an absolute bound would pass an
all-zero output at 32k). Configs that fail to compile (e.g. shared memory) are recorded.

Budget: each shape gets an equal share of --budget-s, unused time carries over to later shapes;
no new timing starts past a shape's share, and shapes reached after the budget are skipped.
Output: a table of every config tried per shape, a summary table, then one JSON line per shape.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch

from . import bench

SHAPES = [(32, 2048), (32, 8192), (32, 32768), (64, 2048), (128, 2048), (128, 8192), (256, 2048)]
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, DTYPE = 32, 8, 128, 16, torch.bfloat16
AXES = {"num_splits": [1, 2, 4, 8, 16], "TILE_N": [16, 32, 64, 128], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4]}
MAX_ROUNDS = 3
MIN_GAIN = 0.01  # a move must be at least 1 % faster
TOLERANCE = 1.6e-2  # x max |output| (tests/kernels/paged_attention_cases.py: bf16)


def coordinate_descent(start: dict, axes: dict, measure, out_of_time) -> tuple[dict, bool]:
    """Minimise measure(config) (seconds or µs; None = rejected) one axis at a time, from start.

    Returns (best config, whether the search finished before out_of_time() said stop). Each config
    is measured at most once; start is measured first even when out of time.
    """
    seen = {}

    def cost(config):
        key = tuple(sorted(config.items()))
        if key not in seen:
            seen[key] = measure(config)
        return seen[key]

    best, best_cost = dict(start), cost(start)
    for _ in range(MAX_ROUNDS):
        moved = False
        for axis, values in axes.items():
            for value in values:
                candidate = {**best, axis: value}
                if tuple(sorted(candidate.items())) in seen:
                    continue
                if out_of_time():
                    return best, False
                c = cost(candidate)
                if c is not None and (best_cost is None or c < best_cost * (1 - MIN_GAIN)):
                    best, best_cost, moved = candidate, c, True
        if not moved:
            break
    return best, True


def triton_launch_defaults() -> dict:
    """num_warps / num_stages of a launch that names no override, to label the default: Triton's
    CUDA num_warps, the kernel's own NUM_STAGES."""
    from paged_kernels.triton_attention import NUM_STAGES

    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return {"num_warps": int(CUDAOptions.num_warps), "num_stages": NUM_STAGES}
    except (ImportError, AttributeError):
        return {"num_warps": 4, "num_stages": NUM_STAGES}


def describe(config: dict) -> str:
    return " ".join(f"{k}={config[k]}" for k in AXES)


def tune_shape(batch, context, *, peak, deadline, num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS,
               head_dim=HEAD_DIM, block_size=BLOCK_SIZE, dtype=DTYPE, device="cuda", timer=None) -> dict:
    """Search one batch x context; returns a record of every config tried and the result (see to_json).
    (Dims, device and timer are arguments for tests on CPU.)"""
    from . import triton_attention as ta

    timer = timer or bench.time_us
    device = torch.device(device)
    query, key, value, sdpa = bench.decode_inputs(batch=batch, context=context, num_heads=num_heads,
                                                  num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                                                  device=device)
    expected = sdpa()[:, :, 0, :].float()
    allowed = TOLERANCE * expected.abs().max().item()
    sdpa_us = timer(sdpa)
    pool = bench.shuffled_pool(key, value, block_size)
    config = ta.launch_config(num_tokens=batch, num_seqs=batch, num_heads=num_heads, num_kv_heads=num_kv_heads,
                              head_dim=head_dim)
    default = {"num_splits": ta.default_num_splits(config, num_tokens=batch, num_seqs=batch, num_kv_heads=num_kv_heads,
                                                   max_context=context, device=device),
               "TILE_N": config["TILE_N"], **triton_launch_defaults()}
    nbytes = bench.decode_bytes(batch=batch, context=context, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                head_dim=head_dim, block_size=block_size, elem_bytes=key.element_size())
    tried = []

    def paged_fn(cfg):
        overrides = None if cfg == default else cfg  # the default exactly as the engine launches it

        def paged():
            return ta.paged_attention(query, scale=head_dim**-0.5, overrides=overrides, **pool)

        return paged

    def measure(cfg):
        entry = {**cfg, "us": None, "max_abs_diff": None, "status": "ok"}
        tried.append(entry)
        paged = paged_fn(cfg)
        try:
            entry["max_abs_diff"] = err = (paged().float() - expected).abs().max().item()
            if not err <= allowed:
                entry["status"] = f"rejected: diff > {allowed:.1e}"
                return None
            entry["us"] = timer(paged)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile or launch is a result, not a crash
            if cfg == default:
                raise
            first_line = (str(exc).strip().splitlines() or [""])[0].replace("|", "/")[:60]
            entry["status"] = f"failed: {type(exc).__name__} {first_line}".strip()
            return None
        return entry["us"]

    axes = dict(AXES, num_splits=sorted(set(AXES["num_splits"]) | {default["num_splits"]}))
    best, complete = coordinate_descent(default, axes, measure, lambda: time.monotonic() > deadline)
    default_us = best_us = tried[0]["us"]
    if best != default:  # back to back, same conditions: the speedup the summary reports
        default_us, best_us = timer(paged_fn(default)), timer(paged_fn(best))
    best_entry = next(e for e in tried if all(e[k] == best[k] for k in AXES))
    return dict(batch=batch, context=context, block_size=block_size, sdpa_us=sdpa_us, nbytes=nbytes, peak=peak,
                allowed=allowed, default=default, default_us=default_us, best=best, best_us=best_us,
                best_diff=best_entry["max_abs_diff"], complete=complete, tried=tried)


def gbps(nbytes, us) -> float:
    return nbytes / (us * 1e-6) / 1e9 if us else 0.0


def pct(nbytes, us, peak) -> str:
    return f"{100 * gbps(nbytes, us) / peak:.0f}%" if peak and us else "n/a"


def shape_table(r: dict) -> list[str]:
    """Every config tried at one shape, in search order."""
    d_us = r["tried"][0]["us"]
    lines = [f"### batch {r['batch']}, context {r['context']}: SDPA {r['sdpa_us']:.1f} µs, "
             f"default {describe(r['default'])}, correct within {r['allowed']:.1e}", "",
             "| # | num_splits | TILE_N | num_warps | num_stages | time (µs) | GB/s | % peak | speedup vs default "
             "| paged / SDPA | max abs diff | status |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for i, e in enumerate(r["tried"]):
        us, err = e["us"], e["max_abs_diff"]
        timing = ([f"{us:.1f}", f"{gbps(r['nbytes'], us):.0f}", pct(r["nbytes"], us, r["peak"]),
                   f"{d_us / us:.3f}" if d_us else "-", f"{us / r['sdpa_us']:.2f}"] if us else ["-"] * 5)
        lines.append("| " + " | ".join([str(i) if i else "0 (default)", *(str(e[k]) for k in AXES), *timing,
                                        f"{err:.1e}" if err is not None else "-", e["status"]]) + " |")
    if not r["complete"]:
        lines.append(f"\nsearch stopped by the time budget (--budget-s) after {len(r['tried'])} configs")
    return lines + [""]


SUMMARY_HEADER = ["| batch | context | SDPA (µs) | default config | default (µs) | best config | best (µs) | GB/s "
                  "| % peak | speedup vs default | best / SDPA | max abs diff | search |",
                  "|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]


def summary_row(r: dict) -> str:
    if "skipped" in r:
        return f"| {r['batch']} | {r['context']} | skipped: {r['skipped']} |"
    if r["best_us"] is None:
        return f"| {r['batch']} | {r['context']} | no config passed the correctness check (see its table) |"
    search = f"{len(r['tried'])} configs, " + ("converged" if r["complete"] else "budget spent (partial)")
    cells = [r["batch"], r["context"], f"{r['sdpa_us']:.1f}", describe(r["default"]), f"{r['default_us']:.1f}",
             describe(r["best"]) if r["best"] != r["default"] else "(default)", f"{r['best_us']:.1f}",
             f"{gbps(r['nbytes'], r['best_us']):.0f}", pct(r["nbytes"], r["best_us"], r["peak"]),
             f"{r['default_us'] / r['best_us']:.3f}", f"{r['best_us'] / r['sdpa_us']:.2f}", f"{r['best_diff']:.1e}",
             search]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def to_json(r: dict, common: dict) -> str:
    """One machine-readable line per shape: the inputs of a new launch heuristic."""
    if "skipped" in r or r["best_us"] is None:
        return json.dumps({**common, "batch": r["batch"], "context": r["context"],
                           "skipped": r.get("skipped", "no config passed the correctness check")})
    keep = ("batch", "context", "block_size", "sdpa_us", "default", "default_us", "best", "best_us", "complete",
            "tried")
    out = {**common, **{k: r[k] for k in keep}, "best_max_abs_diff": r["best_diff"], "tolerance": r["allowed"],
           "best_gbps": round(gbps(r["nbytes"], r["best_us"]), 1),
           "speedup_vs_default": round(r["default_us"] / r["best_us"], 4),
           "best_over_sdpa": round(r["best_us"] / r["sdpa_us"], 4)}
    return json.dumps(out)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(b), int(c)) for b, c in (item.split("x") for item in text.split(",") if item)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BATCHxCONTEXT[,...], e.g. 32x2048, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged_kernels.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=parse_shapes, default=SHAPES, help="BATCHxCONTEXT list (default: the 7 misses)")
    p.add_argument("--budget-s", type=float, default=200.0, help="total search time; shapes share it equally")
    p.add_argument("--peak-gbps", type=float, default=None, help="device peak HBM bandwidth (default: by GPU name)")
    p.add_argument("--out", default=None, help="also write the Markdown output to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("paged_kernels.tune needs a CUDA GPU: it times the Triton decode kernel's launch parameters against "
              "contiguous SDPA, and CPU timings mean nothing here. Run it on a machine with an NVIDIA GPU and triton "
              "installed.", file=sys.stderr)
        return 2
    import triton

    props = torch.cuda.get_device_properties(0)
    peak = args.peak_gbps or bench.peak_gbps(props.name)
    common = dict(gpu=props.name, sms=props.multi_processor_count, peak_gbps=peak, dtype=str(DTYPE).split(".")[-1],
                  num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, triton=triton.__version__,
                  torch=torch.__version__)
    lines = [f"GPU: {props.name} ({props.multi_processor_count} SMs, peak {peak or 'unknown'} GB/s), "
             f"{datetime.date.today()}, torch {torch.__version__}, triton {triton.__version__}, {common['dtype']}, "
             f"heads {NUM_HEADS}/{NUM_KV_HEADS} (q/kv), head_dim {HEAD_DIM}, block {BLOCK_SIZE}, decode; "
             f"coordinate descent (splits, TILE_N, warps, stages; <= {MAX_ROUNDS} rounds, moves >= {MIN_GAIN:.0%}), "
             f"budget {args.budget_s:.0f} s", ""]
    print("\n".join(lines), flush=True)
    start, results = time.monotonic(), []
    for i, (batch, context) in enumerate(args.shapes):
        if time.monotonic() - start > args.budget_s:
            results.append(dict(batch=batch, context=context, skipped="time budget (--budget-s) spent"))
            continue
        deadline = start + args.budget_s * (i + 1) / len(args.shapes)  # equal shares, unused time carries over
        results.append(tune_shape(batch, context, peak=peak, deadline=deadline))
        torch.cuda.empty_cache()
        for line in shape_table(results[-1]):
            lines.append(line)
            print(line, flush=True)
    tail = ["## Summary (default and best re-timed back to back)", "", *SUMMARY_HEADER,
            *(summary_row(r) for r in results), "", f"total {time.monotonic() - start:.0f} s", "",
            "JSON lines (one per shape):", "", "```jsonl", *(to_json(r, common) for r in results), "```"]
    print("\n".join(tail), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines + tail) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
