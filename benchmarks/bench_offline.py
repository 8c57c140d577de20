"""`python benchmarks/bench_offline.py`: this engine vs transformers in the same KV memory.

One seeded workload, the same for every peer, on one device in one dtype (both printed):

  paged        this engine (continuous batching over the block pool)
  generate     transformers `generate` on static batches, each with a `StaticCache` of
               max_model_len tokens per sequence (contiguous preallocation), so the batch
               size is the KV memory divided by one max-length sequence
  cb           transformers' own continuous batching (`generate_batch` manager), paged,
               given the same number of KV blocks of the same size
  ceiling      the limit: the same model's batched decode (contiguous cache) for a static
               batch of the engine's peak concurrency at the workload's mean context;
               "paged ÷ peer" on this row is the engine's fraction of what the model code
               can do on this machine (it counts no prefill, so it is an upper bound)

Output lengths are fixed before timing, so every peer does the same useful work:
  --output-lengths sampled  log-normal (ShareGPT-like) lengths, EOS ignored: for the random
                            weight models (the default bench model, builtin://default);
  --output-lengths eos      real lengths: the engine generates each chat prompt greedily to
                            its EOS (capped at --max-output); every peer then generates that
                            many tokens (EOS ignored), i.e. the same tokens, since greedy
                            decoding is deterministic. The default for any other --model.

Each peer runs --repeats times, interleaved (paged, generate, cb, ceiling, paged, ...), and
the table shows medians with min-max. Tokens/s counts generated tokens, warm-up excluded.
On CPU it also shows tokens per CPU-second of this process (all its threads): on a machine
shared with other work the wall clock says how much CPU the process got, the CPU clock how
much work each peer needs; run with --threads 1 there.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_peers  # noqa: E402

PEERS = ("paged", "generate", "cb", "ceiling")
_TOPICS = ("the ocean", "a volcano", "photosynthesis", "the moon", "bees", "a compiler",
           "the Roman empire", "rain", "chess", "a bicycle", "coffee", "the internet")
_ASKS = ("What is {t}? Answer in one sentence.", "Write a short poem about {t}.",
         "Explain {t} to a child.", "List three facts about {t}.",
         "Summarize the notes above in two sentences.", "Give one tip related to {t}.")


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


def chat_prompts(tokenizer, num: int, seed: int, *, prompt_median: int,
                 max_prompt: int) -> list[list[int]]:
    """Chat-templated questions after notes of log-normal length (words of loadtests')."""
    from loadtests.workloads.base import words

    rng = random.Random(seed)
    prompts = []
    for _ in range(num):
        notes = int(min(max_prompt * 0.6, max(0, rng.lognormvariate(math.log(prompt_median),
                                                                     0.9) * 0.6)))
        ask = rng.choice(_ASKS).format(t=rng.choice(_TOPICS))
        text = (f"Notes: {words(rng, notes)}\n\n{ask}" if notes >= 8 else ask)
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
        prompts.append(list(ids)[:max_prompt])
    return prompts


def build_bench_model(root: Path) -> Path:
    """The default bench model: a ~23M-parameter random-weight Llama (built once)."""
    from engine.builtin_models import build_once
    from engine.default_model import build_checkpoint

    return build_once(root / "bench-llama-23m-v1", lambda tmp: build_checkpoint(
        tmp, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
        intermediate_size=1376, max_position_embeddings=2048, seed=0))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_offline.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint dir or builtin://NAME (default: "
                   "the ~23M random-weight bench model, built once)")
    p.add_argument("--output-lengths", choices=["sampled", "eos"], default=None,
                   help="sampled (default for random-weight models) or eos (otherwise)")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-median", type=int, default=96)
    p.add_argument("--output-median", type=int, default=64, help="sampled lengths only")
    p.add_argument("--max-output", type=int, default=256, help="cap of eos lengths")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--static-batch", type=int, default=16,
                   help="contiguous batch size; the KV memory is this many max-length sequences")
    p.add_argument("--repeats", type=int, default=3, help="runs per peer, interleaved")
    p.add_argument("--peers", default=",".join(PEERS), help="subset of " + ",".join(PEERS))
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for every peer (default: torch's)")
    p.add_argument("--model-dir", default=None, help="where to build the bench checkpoint")
    p.add_argument("--prefill-shape", default="16x128", metavar="SEQSxLEN",
                   help="the prefill comparison: this many fresh prompts of this many tokens "
                        "in one engine step vs one forward of the model over the same batch "
                        "(needs the paged and ceiling peers; 0 skips it)")
    p.add_argument("--json", default=None, help="also write every run as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if args.num_requests < 1 or args.repeats < 1:
        parser.error("--num-requests and --repeats must be >= 1")
    if not peers or set(peers) - set(PEERS):
        parser.error(f"--peers takes a comma-separated subset of {','.join(PEERS)}")
    import torch
    from transformers import AutoTokenizer

    from engine.builtin_models import model_cache_root
    from engine.model_loader import resolve_model_path

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device if args.device != "auto" else (
        "cuda" if torch.cuda.is_available() else "cpu")
    random_weights = args.model in (None, "builtin://default")
    mode = args.output_lengths or ("sampled" if random_weights else "eos")
    path = (resolve_model_path(args.model) if args.model else
            build_bench_model(Path(args.model_dir) if args.model_dir else model_cache_root()))
    kv_tokens = args.static_batch * args.max_model_len  # the same KV memory for every peer
    num_blocks = kv_tokens // args.block_size
    common = dict(device=device, dtype=args.dtype)
    paged = bench_peers.PagedPeer(path, num_blocks=num_blocks, block_size=args.block_size,
                                  max_model_len=args.max_model_len, max_num_seqs=256, **common)
    max_prompt = args.max_model_len // 2
    if mode == "sampled":
        shapes = sharegpt_like(args.num_requests, args.seed, prompt_median=args.prompt_median,
                               output_median=args.output_median, max_prompt=max_prompt,
                               max_output=args.max_model_len - max_prompt)
        rng = random.Random(args.seed)
        requests = [([rng.randrange(3, 600) for _ in range(p)], o) for p, o in shapes]
    else:
        prompts = chat_prompts(AutoTokenizer.from_pretrained(path), args.num_requests,
                               args.seed, prompt_median=args.prompt_median,
                               max_prompt=max_prompt)
        cap = min(args.max_output, args.max_model_len - max_prompt)
        requests = list(zip(prompts, paged.eos_lengths(prompts, cap)))
    runners: dict[str, object] = {}
    for key in peers:
        if key == "paged":
            runners[key] = paged
        elif key == "generate":
            runners[key] = bench_peers.StaticGeneratePeer(
                path, batch_size=args.static_batch, max_model_len=args.max_model_len, **common)
        elif key == "cb":
            runners[key] = bench_peers.ContinuousBatchingPeer(
                path, num_blocks=num_blocks, block_size=args.block_size, **common)
        else:
            runners[key] = bench_peers.DecodeCeilingPeer(path, **common)
    # the ceiling's static batch: the engine's peak concurrency (from its first run below)
    context = round(statistics.fmean(len(p) + o / 2 for p, o in requests))
    if "ceiling" in runners:
        runners["ceiling"].configure(args.static_batch, context)
    requested = sum(o for _, o in requests)
    print(f"# model {args.model or path.name} ({path}); output lengths: {mode}; device "
          f"{device}, dtype {args.dtype}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"# {len(requests)} requests, prompt median "
          f"{statistics.median(len(p) for p, _ in requests):.0f} tokens, output median "
          f"{statistics.median(o for _, o in requests):.0f} (total {requested}), mean context "
          f"{context}; KV memory {kv_tokens} token slots; {args.repeats} interleaved repeats")
    runs: dict[str, list[dict]] = {k: [] for k in runners}
    for _ in range(args.repeats):
        for key, runner in runners.items():
            try:
                runs[key].append(runner.run(requests))
                if key == "paged" and len(runs[key]) == 1 and "ceiling" in runners:
                    runners["ceiling"].configure(runs[key][0]["concurrency"], context)
            except Exception as exc:  # a failing peer is reported, not fatal to the table
                print(f"# {runner.name} failed: {type(exc).__name__}: {exc}")
    prefill = {}
    if args.prefill_shape != "0" and {"paged", "ceiling"} <= set(runners):
        seqs, length = _prefill_shape(parser, args.prefill_shape)
        for key in ("paged", "ceiling"):  # interleaved: paged, ceiling, paged, ...
            prefill[key] = runners[key].prefill(seqs, length, max(3, args.repeats))
        prefill["shape"] = (seqs, length)
    for key, key_runs in runs.items():
        for r in key_runs:
            r["requested"] = requested if key != "ceiling" else r["generated"]
            r["tok_s"] = r["generated"] / r["seconds"]
            r["tok_cpu_s"] = r["generated"] / max(r["cpu_seconds"], 1e-9)
            if r["generated"] != r["requested"]:
                print(f"# {runners[key].name} produced {r['generated']} of {requested} tokens")
    print_table(runners, runs, requests)
    print_targets(runs, prefill)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device, "dtype": args.dtype, "model": str(path), "output_lengths": mode,
            "requested_tokens": requested, "prefill": prefill,
            "peers": {k: {"name": runners[k].name, "device": str(runners[k].device),
                          "dtype": str(runners[k].dtype), "runs": v} for k, v in runs.items()}},
            indent=2, default=str))
    return 0


def _prefill_shape(parser, text: str) -> tuple[int, int]:
    try:
        seqs, length = (int(x) for x in text.lower().split("x"))
    except ValueError:
        parser.error(f"--prefill-shape takes SEQSxLEN, e.g. 16x128, or 0; not {text!r}")
    if seqs < 1 or length < 1 or seqs * length > 2048:
        parser.error(f"--prefill-shape {text}: both >= 1 and at most 2048 tokens in all "
                     "(the engine's per-step token budget here)")
    return seqs, length


def print_targets(runs: dict[str, list[dict]], prefill: dict) -> None:
    """The engine against the model's own code on the same machine, same run."""
    rows = []
    if runs.get("paged") and runs.get("ceiling"):
        engine = [r["decode_peak_tok_s"] for r in runs["paged"]
                  if r.get("decode_peak_tok_s") == r.get("decode_peak_tok_s")]
        ceiling = statistics.median(r["tok_s"] for r in runs["ceiling"])
        if engine:
            batch = runs["ceiling"][-1]["concurrency"]
            rows.append((f"decode tok/s, pure-decode steps at >= 90 % of the peak batch "
                         f"(ceiling: a static batch of {batch})", statistics.median(engine),
                         ceiling))
    if prefill:
        seqs, length = prefill["shape"]
        rows.append((f"prefill tok/s, {seqs} fresh prompts x {length} tokens (one engine step "
                     "vs one forward)", prefill["paged"]["tok_s"], prefill["ceiling"]["tok_s"]))
    if not rows:
        return
    print("\n| measure | this engine | the model's own | engine ÷ model |")
    print("|---|---:|---:|---:|")
    for name, mine, model in rows:
        print(f"| {name} | {mine:.1f} | {model:.1f} | {mine / model:.2f}x |")


def _fmt_pct(x) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


def print_table(runners: dict, runs: dict[str, list[dict]], requests) -> None:
    base = statistics.median(r["tok_s"] for r in runs["paged"]) if runs.get("paged") else None
    cpu_base = (statistics.median(r["tok_cpu_s"] for r in runs["paged"])
                if runs.get("paged") else None)
    print("| peer | device, dtype | tokens/s median (min-max) | seconds | paged ÷ peer "
          "| tokens per CPU-s | paged ÷ peer (CPU) | KV slots | KV util. at peak | mean util. "
          "| max concurrent seqs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, key_runs in runs.items():
        if not key_runs:
            continue
        runner, last = runners[key], key_runs[-1]
        tok = sorted(r["tok_s"] for r in key_runs)
        med = statistics.median(tok)
        secs = statistics.median(r["seconds"] for r in key_runs)
        ratio = f"{base / med:.2f}x" if base else "-"
        cpu_med = statistics.median(r["tok_cpu_s"] for r in key_runs)
        cpu_ratio = f"{cpu_base / cpu_med:.2f}x" if cpu_base else "-"
        slots = last["kv_slots"] if last["kv_slots"] is not None else "-"
        conc = last["concurrency"] if last["concurrency"] is not None else "-"
        print(f"| {runner.name} | {runner.device}, {runner.dtype} | {med:.1f} "
              f"({tok[0]:.1f}-{tok[-1]:.1f}) | {secs:.1f} | {ratio} | {cpu_med:.1f} | "
              f"{cpu_ratio} | {slots} | "
              f"{_fmt_pct(last['util'])} | {_fmt_pct(last['mean_util'])} | {conc} |")


if __name__ == "__main__":
    raise SystemExit(main())
