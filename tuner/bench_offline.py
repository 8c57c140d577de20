"""`python -m tuner bench offline`: this engine vs transformers in the same KV memory.

One seeded workload (ShareGPT-like log-normal prompt and output lengths) on a ~23M
parameter Llama-shaped checkpoint built in-process; three peers run it in one process:

  paged        this engine (continuous batching over the block pool)
  generate     transformers `generate` on static batches; each batch preallocates
               contiguous KV for max_model_len tokens per sequence, so the batch size is
               the KV memory divided by one max-length sequence
  cb           transformers' own continuous batching (`generate_batch` manager), paged,
               given the same number of KV blocks of the same size

Every request generates exactly its sampled output length (EOS ignored), so all peers do
the same useful work; tokens/s counts prompt-excluded generated tokens, warm-up excluded.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path


def sharegpt_like(num: int, seed: int, *, prompt_median: int, output_median: int,
                  max_prompt: int, max_output: int) -> list[tuple[int, int]]:
    """(prompt_len, output_len) pairs: log-normal, long right tail, like ShareGPT's."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(num):
        p = int(min(max_prompt, max(4, rng.lognormvariate(math.log(prompt_median), 0.9))))
        o = int(min(max_output, max(4, rng.lognormvariate(math.log(output_median), 0.8))))
        pairs.append((p, o))
    return pairs


def build_bench_model(root: Path) -> Path:
    from engine.default_model import build_checkpoint

    path = root / "bench-llama-23m-v1"
    if not (path / "model.safetensors").exists():
        build_checkpoint(path, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
                         intermediate_size=1376, max_position_embeddings=2048, seed=0)
    return path


def run_paged(path: Path, requests: list[tuple[list[int], int]], num_blocks: int,
              block_size: int, max_model_len: int, max_num_seqs: int) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(model=str(path), block_size=block_size, num_gpu_blocks_override=num_blocks,
              max_model_len=max_model_len, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=2048, enable_prefix_caching=False)
    engine = llm.llm_engine
    llm.generate({"prompt_token_ids": requests[0][0]}, SamplingParams(max_tokens=4))  # warm-up
    for i, (ids, out_len) in enumerate(requests):
        engine.add_request(f"r{i}", ids, SamplingParams(temperature=0, max_tokens=out_len,
                                                        ignore_eos=True))
    peak_used, util_at_peak, max_running, utils = 0, 0.0, 0, []
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        kv = engine.kv.stats()
        live = sum(s.num_computed_tokens for s in engine.scheduler.running)
        slots = kv.num_used * block_size
        if slots:
            utils.append(live / slots)
        if kv.num_used >= peak_used and slots:
            peak_used, util_at_peak = kv.num_used, live / slots
        max_running = max(max_running, len(engine.scheduler.running))
    elapsed = time.perf_counter() - start
    generated = engine.get_stats().generation_tokens - 4
    return dict(tok_s=generated / elapsed, seconds=elapsed, util=util_at_peak,
                mean_util=statistics.fmean(utils), concurrency=max_running,
                preemptions=engine.get_stats().num_preemptions)


def run_static_generate(path: Path, requests: list[tuple[list[int], int]], batch_size: int,
                        max_model_len: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad = model.generation_config.pad_token_id or 0

    def run_batch(batch):
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        new = max(o for _, o in batch)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=pad)
        # contiguous preallocation: every row reserves max_model_len slots
        live = sum(len(p) + o for p, o in batch)
        return live / (len(batch) * max_model_len)

    run_batch(requests[:2])  # warm-up
    start = time.perf_counter()
    utils = [run_batch(requests[i:i + batch_size]) for i in range(0, len(requests), batch_size)]
    elapsed = time.perf_counter() - start
    useful = sum(o for _, o in requests)
    return dict(tok_s=useful / elapsed, seconds=elapsed, util=max(utils),
                mean_util=statistics.fmean(utils), concurrency=batch_size, preemptions=0)


def run_transformers_cb(path: Path, requests: list[tuple[list[int], int]], num_blocks: int,
                        block_size: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=16)
    cbc = ContinuousBatchingConfig(page_size=block_size, num_blocks=num_blocks,
                                   max_batch_tokens=2048, use_cuda_graph=False)
    useful = sum(o for _, o in requests)
    with model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=cbc, block=True, timeout=5) as mgr:
        mgr.add_request(requests[0][0], max_new_tokens=4)  # warm-up
        while not (r := mgr.get_result(timeout=1)) or not r.is_finished():
            pass
        start = time.perf_counter()
        for ids, out_len in requests:
            mgr.add_request(ids, max_new_tokens=out_len)
        done, generated = 0, 0
        while done < len(requests):
            result = mgr.get_result(timeout=1)
            if result is not None and result.is_finished():
                done += 1
                generated += len(result.generated_tokens)
            elif result is None and not mgr.is_running():
                raise RuntimeError("transformers' continuous batching manager stopped")
        elapsed = time.perf_counter() - start
    if generated != useful:  # count only what it really produced, and say so
        print(f"# transformers generate_batch produced {generated} of {useful} requested tokens")
    return dict(tok_s=generated / elapsed, seconds=elapsed, util=float("nan"),
                mean_util=float("nan"), concurrency=None, preemptions=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner bench offline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="offline", choices=["offline"],
                        help="the benchmark to run")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-median", type=int, default=96)
    parser.add_argument("--output-median", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--static-batch", type=int, default=16,
                        help="contiguous batch size; the KV memory is this many max-length sequences")
    parser.add_argument("--peers", default="paged,generate,cb",
                        help="comma-separated subset of paged,generate,cb")
    parser.add_argument("--model-dir", default=None, help="where to build the bench checkpoint")
    args = parser.parse_args(argv)
    if args.num_requests < 1:
        parser.error("--num-requests must be >= 1")
    import torch
    from engine.default_model import default_model_dir

    root = Path(args.model_dir) if args.model_dir else default_model_dir().parent
    path = build_bench_model(root)
    rng = random.Random(args.seed)
    max_prompt = args.max_model_len // 2
    shapes = sharegpt_like(args.num_requests, args.seed, prompt_median=args.prompt_median,
                           output_median=args.output_median, max_prompt=max_prompt,
                           max_output=args.max_model_len - max_prompt)
    vocab = 600
    requests = [([rng.randrange(3, vocab) for _ in range(p)], o) for p, o in shapes]
    kv_tokens = args.static_batch * args.max_model_len  # the same KV memory for every peer
    num_blocks = kv_tokens // args.block_size
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    print(f"# {len(requests)} requests, prompt median {statistics.median(p for p, _ in shapes):.0f} "
          f"tokens, output median {statistics.median(o for _, o in shapes):.0f}; KV memory "
          f"{kv_tokens} token slots; torch {torch.__version__}, {torch.get_num_threads()} threads")
    results = {}
    if "paged" in peers:
        results["paged (this engine)"] = run_paged(path, requests, num_blocks, args.block_size,
                                                   args.max_model_len, max_num_seqs=256)
    if "generate" in peers:
        results["transformers generate, static"] = run_static_generate(
            path, requests, args.static_batch, args.max_model_len)
    if "cb" in peers:
        try:
            results["transformers generate_batch"] = run_transformers_cb(
                path, requests, num_blocks, args.block_size)
        except Exception as exc:  # a peer failing is reported, not fatal to the table
            print(f"# transformers generate_batch failed: {type(exc).__name__}: {exc}")
    base = results.get("paged (this engine)", {}).get("tok_s")
    print("| peer | tokens/s | seconds | paged ÷ peer | KV slot util. at peak | mean util. | max concurrent seqs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        ratio = f"{base / r['tok_s']:.2f}x" if base else "-"
        util = "-" if r["util"] != r["util"] else f"{100 * r['util']:.1f}%"
        mean = "-" if r["mean_util"] != r["mean_util"] else f"{100 * r['mean_util']:.1f}%"
        print(f"| {name} | {r['tok_s']:.1f} | {r['seconds']:.1f} | {ratio} | {util} | {mean} | "
              f"{r['concurrency'] if r['concurrency'] is not None else '-'} |")
    return 0
