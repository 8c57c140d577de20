"""Decode-attention roofline benchmark for the Triton paged-attention kernel (CUDA only).

    python -m paged_kernels.bench [--batch 1,8,32,64,128,256] [--context 512,2048,8192,32768]
                            [--block-size 8,16,32,64,128] [--out table.md]

For each batch x context it times one decode step (one query per sequence) of the paged
kernel at every block size, and the same math on contiguous KV with torch SDPA (which picks
flash / cuDNN / memory-efficient attention, whichever the device has). Columns: time, achieved
HBM bandwidth and its share of the device's peak, and paged time / contiguous time.

Both read the same values: the paged pool is the contiguous K/V viewed as blocks, and each
sequence's block-table row is a random permutation of its own blocks, so the physical order
differs from the logical one while a decode's output (a permutation-invariant softmax sum)
must equal SDPA's; the max |difference| column checks that. Timing uses CUDA graphs so launch
overhead is excluded; the kernel is called directly, without the backend's launch checks.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch

# Peak HBM bandwidth in GB/s by device-name fragment (vendor datasheets); --peak-gbps overrides.
PEAK_GBPS = {
    "H200": 4800, "H100 SXM": 3350, "H100 80GB HBM3": 3350, "H100 PCIe": 2000, "H100 NVL": 3900,
    "GH200": 4000, "B200": 8000, "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100-SXM4-40GB": 1555,
    "A100-PCIE-40GB": 1555, "L40S": 864, "L4": 300, "A10G": 600, "RTX 4090": 1008,
}


def peak_gbps(device_name: str) -> float | None:
    for fragment, gbps in sorted(PEAK_GBPS.items(), key=lambda kv: -len(kv[0])):  # most specific first
        if fragment.lower() in device_name.lower():
            return float(gbps)
    return None


def decode_bytes(*, batch, context, num_heads, num_kv_heads, head_dim, block_size, elem_bytes) -> int:
    """HBM traffic of one decode step: all K and V once, queries in, outputs out, block tables."""
    kv = 2 * batch * context * num_kv_heads * head_dim * elem_bytes
    q_and_out = 2 * batch * num_heads * head_dim * elem_bytes
    tables = batch * (context // block_size) * 4 if block_size else 0
    return kv + q_and_out + tables


def parse_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged_kernels.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=parse_ints, default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--context", type=parse_ints, default=[512, 2048, 8192, 32768])
    p.add_argument("--block-size", type=parse_ints, default=[8, 16, 32, 64, 128])
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--peak-gbps", type=float, default=None, help="device peak HBM bandwidth (default: by GPU name)")
    p.add_argument("--max-kv-gib", type=float, default=None,
                   help="skip shapes whose two K/V copies exceed this (default: 60%% of GPU memory)")
    p.add_argument("--budget-s", type=float, default=270.0, help="stop starting new shapes after this many seconds")
    p.add_argument("--out", default=None, help="also write the Markdown table to this file")
    return p


def time_us(fn) -> float:
    import triton.testing

    fn()  # compile / warm up outside the graph
    torch.cuda.synchronize()
    try:
        return 1000.0 * triton.testing.do_bench_cudagraph(fn, rep=50)
    except RuntimeError:  # capture refused (old driver, debug mode): plain events instead
        return 1000.0 * triton.testing.do_bench(fn, warmup=10, rep=50)


def decode_inputs(*, batch, context, num_heads, num_kv_heads, head_dim, dtype, device):
    """One decode step's tensors: keys and values in paged storage order [batch, context, kv_heads, D], queries
    [batch, heads, D], and a function running the same attention with SDPA on contiguous copies of K/V
    (output [batch, heads, 1, D]: the reference and the speed bar)."""
    key = torch.randn(batch, context, num_kv_heads, head_dim, device=device, dtype=dtype)
    value = torch.randn(batch, context, num_kv_heads, head_dim, device=device, dtype=dtype)
    query = torch.randn(batch, num_heads, head_dim, device=device, dtype=dtype)
    # Contiguous copies in SDPA's layout [batch, kv_heads, context, D], same values.
    key_c, value_c = key.transpose(1, 2).contiguous(), value.transpose(1, 2).contiguous()
    q_c = query[:, :, None, :]
    scale = head_dim**-0.5

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q_c, key_c, value_c, scale=scale, enable_gqa=True)

    return query, key, value, sdpa


def shuffled_pool(key, value, block_size) -> dict:
    """paged_attention's cache arguments for one decode per sequence over key/value [batch, context, kv_heads, D]:
    the same memory viewed as [blocks, block_size, kv_heads, D], sequence b's block-table row a random
    permutation of its own blocks (b * per_seq ...), so the physical order differs from the logical one."""
    batch, context, kvh, d = key.shape
    dev = key.device
    per_seq = context // block_size
    order = torch.rand(batch, per_seq, device=dev).argsort(dim=1)
    tables = (order + per_seq * torch.arange(batch, device=dev)[:, None]).to(torch.int32)
    return dict(key_cache=key.view(batch * per_seq, block_size, kvh, d),
                value_cache=value.view(batch * per_seq, block_size, kvh, d),
                cu_seqlens_q=torch.arange(batch + 1, device=dev, dtype=torch.int32),
                seq_lens=torch.full((batch,), context, device=dev, dtype=torch.int32), block_tables=tables)


def bench_shape(args, *, batch, context, dtype, peak, device="cuda", timer=None) -> list[list[str]]:
    """All block sizes for one batch x context; returns table rows. (device/timer: for tests on CPU.)"""
    from . import triton_attention

    timer = timer or time_us
    h, kvh, d = args.num_heads, args.num_kv_heads, args.head_dim
    scale = d**-0.5
    query, key, value, sdpa = decode_inputs(batch=batch, context=context, num_heads=h, num_kv_heads=kvh, head_dim=d,
                                            dtype=dtype, device=torch.device(device))
    expected = sdpa()[:, :, 0, :]
    sdpa_us = timer(sdpa)
    elem = key.element_size()
    sdpa_bytes = decode_bytes(batch=batch, context=context, num_heads=h, num_kv_heads=kvh, head_dim=d,
                              block_size=0, elem_bytes=elem)
    rows = [[str(batch), str(context), "contiguous (SDPA)", f"{sdpa_us:.1f}", *bandwidth(sdpa_bytes, sdpa_us, peak),
             "1.00", "-"]]
    for block_size in args.block_size:
        if context % block_size:
            continue
        pool = shuffled_pool(key, value, block_size)

        def paged():
            return triton_attention.paged_attention(query, scale=scale, **pool)

        err = (paged().float() - expected.float()).abs().max().item()
        us = timer(paged)
        nbytes = decode_bytes(batch=batch, context=context, num_heads=h, num_kv_heads=kvh, head_dim=d,
                              block_size=block_size, elem_bytes=elem)
        rows.append([str(batch), str(context), str(block_size), f"{us:.1f}", *bandwidth(nbytes, us, peak),
                     f"{us / sdpa_us:.2f}", f"{err:.1e}"])
    return rows


def bandwidth(nbytes: int, us: float, peak: float | None) -> list[str]:
    gbps = nbytes / (us * 1e-6) / 1e9
    return [f"{gbps:.0f}", f"{100 * gbps / peak:.0f}%" if peak else "n/a"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("paged_kernels.bench needs a CUDA GPU: it times the Triton decode kernel against contiguous SDPA, and "
              "CPU timings mean nothing here. Run it on a machine with an NVIDIA GPU and triton installed.",
              file=sys.stderr)
        return 2
    import triton

    dtype = getattr(torch, args.dtype)
    props = torch.cuda.get_device_properties(0)
    peak = args.peak_gbps or peak_gbps(props.name)
    cap = args.max_kv_gib if args.max_kv_gib is not None else 0.6 * props.total_memory / 2**30
    header = (f"GPU: {props.name} (peak {peak or 'unknown'} GB/s), {datetime.date.today()}, torch {torch.__version__}, "
              f"triton {triton.__version__}, {args.dtype}, heads {args.num_heads}/{args.num_kv_heads} (q/kv), "
              f"head_dim {args.head_dim}, decode (1 query per sequence)")
    lines = [header, "", "| batch | context | block | time (µs) | GB/s | % peak | paged / contiguous | max abs diff |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    start = time.monotonic()
    for batch in args.batch:
        for context in args.context:
            kv_gib = 4 * batch * context * args.num_kv_heads * args.head_dim * dtype.itemsize / 2**30  # 2 copies of K+V
            if kv_gib > cap:
                rows = [[str(batch), str(context), "all", f"skipped: {kv_gib:.0f} GiB of K/V > {cap:.0f} GiB cap"]]
            elif time.monotonic() - start > args.budget_s:
                rows = [[str(batch), str(context), "all", "skipped: time budget (--budget-s) spent"]]
            else:
                rows = bench_shape(args, batch=batch, context=context, dtype=dtype, peak=peak)
                torch.cuda.empty_cache()
            for row in rows:
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
