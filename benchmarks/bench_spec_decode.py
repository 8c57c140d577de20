"""Speculative decoding (n-gram prompt lookup, suffix decoding) against plain decoding, same
model, same run.

For each workload and concurrency, every configuration (off, n-gram with k = 2, 4 drafts,
suffix decoding with --suffix-k) serves the same requests, closed loop: `concurrency`
requests in flight, a new one admitted when one finishes. Before the measured rounds each
engine serves --warmup requests of the workload (other seeds, not timed), as a running
service has: suffix decoding drafts from what earlier requests wrote. Greedy decoding, so
every configuration produces the same tokens (checked, in float32; with --dtype bfloat16
a batched verification rounds otherwise than a one-row decode and may flip a near-tied
argmax, so the outputs identical to the round's first configuration are counted and
printed instead).
Configurations take turns within each round (the order alternates), so a shared, noisy
machine slows them alike; the table gives medians over rounds and ratios against "off".

Workloads (distinct prompts per request, so the prefix cache does not help one config):
- summarize: a document, then a request to restate it (the answer copies the prompt);
- code: a Python module, then a request to return it with a docstring added to each
  function (copies, and writes new text);
- code-edit: the same kind of module, then a request to return it with type hints added
  (copies, with small edits on each signature);
- chat: a short question (little to copy);
- agentic: one step of a tool-calling session of loadtests/workloads/agentic.py (the
  system prompt with the tools' JSON schemas, the task, 0-2 earlier calls and their
  results, at --length-scale 0.5): the model writes a JSON call in the same scaffolding
  every time, from a prompt it copies little of.

    python benchmarks/bench_spec_decode.py --model builtin://smollm2-135m-instruct \
        --concurrency 1,4 --requests 4 --max-tokens 96 --threads 1 \
        --workloads code-edit,agentic --suffix-k 8
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_NOUNS = ("library council budget station bridge river school market garden museum harbor "
          "tower clinic park road").split()
_VERBS = "opened approved funded repaired closed expanded planned visited".split()


def _document(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        a, b = rng.sample(_NOUNS, 2)
        out.append(f"The {a} {rng.choice(_VERBS)} the new {b} in {rng.choice(['March', 'May', 'June', 'July'])} "
                   f"after {rng.randint(2, 9)} years of work.")
    return " ".join(out)


def _module(rng: random.Random, functions: int) -> str:
    out = []
    for i in range(functions):
        a, b = rng.sample(_NOUNS, 2)
        out.append(f"def load_{a}_{i}(path, limit):\n    rows = read_rows(path)\n"
                   f"    {b} = [r for r in rows if r.size < limit]\n    return sorted({b})\n")
    return "\n".join(out)


def _agent_step(rng: random.Random) -> list[dict]:
    """The messages of one step of an agent session: 0-2 earlier calls (the session's
    own seeded calls) and their results, then the request for the next call."""
    from loadtests.workloads.agentic import AgentSession

    session = AgentSession(rng, scale=0.5)
    for _ in range(rng.randint(0, min(2, session.steps - 1))):
        session.next_request()
        session.record_response("")  # no valid call: the session's seeded one is used
    return session.next_request().body["messages"]


def prompts(workload: str, count: int, seed: int) -> list[str | list[dict]]:
    """The user messages of one workload (distinct per request); agentic's are whole
    conversations (lists of chat messages)."""
    rng = random.Random(f"{workload}-{seed}")
    out = []
    for _ in range(count):
        if workload == "summarize":
            out.append(f"{_document(rng, 8)}\n\nRepeat the text above exactly, sentence by sentence.")
        elif workload == "code":
            out.append(f"{_module(rng, 4)}\nReturn the whole module above unchanged, adding a "
                       "docstring to each function.")
        elif workload == "code-edit":
            out.append(f"{_module(rng, 4)}\nReturn the whole module above unchanged, adding "
                       "type hints to every function's parameters and return value.")
        elif workload == "chat":
            a, b = rng.sample(_NOUNS, 2)
            out.append(f"In a few sentences, how should a city decide between a new {a} and "
                       f"a new {b}?")
        elif workload == "agentic":
            out.append(_agent_step(rng))
        else:
            raise ValueError(f"unknown workload {workload!r}")
    return out


def run_closed_loop(engine, texts: list[str], concurrency: int, max_tokens: int, tag: str):
    """Serve `texts` with `concurrency` in flight; returns (wall seconds, outputs by index,
    per-request TPOT seconds, spec counters added)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    before = engine.get_stats()
    pending = list(enumerate(texts))
    done: dict[int, object] = {}
    start = time.perf_counter()
    in_flight = 0
    while pending or in_flight:
        while pending and in_flight < concurrency:
            i, text = pending.pop(0)
            engine.add_request(f"{tag}-{i}", text, params)
            in_flight += 1
        for out in engine.step():
            if out.finished:
                done[int(out.request_id.rsplit("-", 1)[1])] = out
                in_flight -= 1
    wall = time.perf_counter() - start
    tpot = []
    for out in done.values():
        m, n = out.metrics, len(out.outputs[0].token_ids)
        if n > 1:
            tpot.append((m.finished_time - m.first_token_time) / (n - 1))
    after = engine.get_stats()
    spec = (after.spec_num_drafts - before.spec_num_drafts,
            after.spec_num_draft_tokens - before.spec_num_draft_tokens,
            after.spec_num_accepted_tokens - before.spec_num_accepted_tokens,
            [a - b for a, b in zip(after.spec_num_accepted_tokens_per_pos,
                                   before.spec_num_accepted_tokens_per_pos or
                                   [0] * len(after.spec_num_accepted_tokens_per_pos))])
    return wall, [done[i] for i in range(len(texts))], tpot, spec


def tokens_per_step(spec_total: list, tokens: int) -> str:
    """Tokens per sequence step: every step of a sequence yields one token (the prefill's
    first included) plus the drafts it accepted, so steps = tokens - accepted."""
    accepted = spec_total[2]
    return f"{tokens / (tokens - accepted):.2f}" if tokens > accepted else "–"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="checkpoint or builtin://NAME (default: the 23M bench Llama)")
    p.add_argument("--workloads", default="summarize,code,chat")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--k", default="2,4",
                   help='n-gram num_speculative_tokens values to compare ("": none)')
    p.add_argument("--suffix-k", default="",
                   help="suffix decoding num_speculative_tokens values to compare (vLLM's "
                        "other suffix_decoding_* defaults), e.g. 8,16")
    p.add_argument("--suffix-memory", type=int, default=0, metavar="N",
                   help="only measure the suffix tree's memory over N agentic outputs "
                        "(benchmarks/suffix_memory.py) and exit")
    p.add_argument("--warmup", type=int, default=8,
                   help="requests each engine serves, untimed, before a workload's rounds")
    p.add_argument("--prompt-lookup", default="2,4", help="prompt_lookup_min,max")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per workload and concurrency (default: the concurrency, "
                        "at least 4)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="weights and activations (bfloat16: outputs counted, not asserted, "
                        "identical across configurations)")
    p.add_argument("--gate", default=None,
                   help='also each k (n-gram and suffix) with these gate keys, e.g. '
                        '\'{"min_acceptance_rate": 0.3}\' (engine/spec_decode/gate.py)')
    p.add_argument("--tuned", action="store_true",
                   help="off against the tuner's choice of num_speculative_tokens, chosen per "
                        "workload and concurrency on other requests (benchmarks/"
                        "spec_decode_tuned.py); --k is then unused")
    p.add_argument("--calibration-rounds", type=int, default=3,
                   help="with --tuned: rounds of the choice's calibration requests")
    return p


def _model_path(model: str | None) -> str:
    if model:
        return model
    from benchmarks.bench_decode import bench_model_path
    return str(bench_model_path(None))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.suffix_memory:
        from transformers import AutoTokenizer

        from benchmarks import suffix_memory
        from engine.builtin_models import ensure_builtin, is_builtin

        model = _model_path(args.model)
        path = ensure_builtin(model) if is_builtin(model) else model
        suffix_memory.run(AutoTokenizer.from_pretrained(path), args.suffix_memory)
        return 0
    import torch

    from engine import LLMEngine

    lo, hi = (int(x) for x in args.prompt_lookup.split(","))
    levels = [int(c) for c in args.concurrency.split(",")]
    configs = {"off": None}
    for k in (int(x) for x in args.k.split(",") if x):
        configs[f"k={k}"] = {"method": "ngram", "num_speculative_tokens": k,
                             "prompt_lookup_min": lo, "prompt_lookup_max": hi}
        if args.gate:
            configs[f"k={k} gated"] = {**configs[f"k={k}"], **json.loads(args.gate)}
    for k in (int(x) for x in args.suffix_k.split(",") if x):
        configs[f"suffix k={k}"] = {"method": "suffix", "num_speculative_tokens": k}
        if args.gate:
            configs[f"suffix k={k} gated"] = {**configs[f"suffix k={k}"], **json.loads(args.gate)}
    model = _model_path(args.model)

    def build(spec):
        # KV for max(levels) sequences of up to 1280 tokens (prompts here are < 1024)
        return LLMEngine.from_args(
            model=model, max_model_len=2048, max_num_seqs=max(levels),
            num_gpu_blocks_override=max(levels) * 80 + 64, block_size=16,
            speculative_config=spec, device="cpu", dtype=args.dtype, cpu_threads=args.threads)

    if args.tuned:
        from benchmarks import spec_decode_tuned

        engines = {}

        def engine_for(k):
            if k not in engines:
                engines[k] = build(spec_decode_tuned.spec_config(k, lo, hi))
            return engines[k]

        tokenizer = engine_for(0).tokenizer
    else:
        engines = {name: build(spec) for name, spec in configs.items()}
        tokenizer = next(iter(engines.values())).tokenizer
    chat = tokenizer.chat_template is not None

    def texts_for(workload, count, seed):
        conversations = [[{"role": "user", "content": t}] if isinstance(t, str) else t
                         for t in prompts(workload, count, seed=seed)]
        if not chat:
            return ["\n\n".join(m["content"] for m in c) for c in conversations]
        return [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                for c in conversations]

    print(f"# {Path(model).name}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.dtype}, greedy, max_tokens {args.max_tokens}, prompt_lookup {lo}..{hi}; closed loop; "
          f"{args.warmup} warm-up requests per engine and workload; "
          f"{args.rounds} rounds, configurations in turn; medians")
    if args.tuned:
        spec_decode_tuned.run(args, engine_for, texts_for, run_closed_loop, levels)
        return 0
    same: dict[tuple, list[int]] = {}   # (workload, conc, config) -> [identical, requests]
    print("| workload | conc | config | out tok/s | TPOT ms | tok/s vs off | TPOT vs off | "
          "tokens/step | accepted % | accepted % per position |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for workload in args.workloads.split(","):
        for c in levels:
            n = args.requests or max(4, c)
            rates: dict[str, list[float]] = {k: [] for k in configs}
            tpots: dict[str, list[float]] = {k: [] for k in configs}
            spec_totals = {k: [0, 0, 0, None] for k in configs}
            tokens_out = dict.fromkeys(configs, 0)
            if args.warmup:
                warm = texts_for(workload, args.warmup, 1000 + c)
                for name in configs:
                    run_closed_loop(engines[name], warm, c, args.max_tokens,
                                    f"w{workload}{c}{name}")
            for r in range(args.rounds):
                # seeds apart per concurrency: suffix decoding remembers what it served, so
                # the same requests at a second level would be served from its own outputs
                texts = texts_for(workload, n, 100 * c + r)
                reference = None
                order = list(configs) if r % 2 == 0 else list(configs)[::-1]
                for name in order:
                    wall, outs, tpot, spec = run_closed_loop(
                        engines[name], texts, c, args.max_tokens, f"{workload}{c}{name}{r}")
                    tokens = [o.outputs[0].token_ids for o in outs]
                    if reference is None:
                        reference = tokens
                    if args.dtype == "float32":
                        assert tokens == reference, f"{name} changed the greedy output"
                    tally = same.setdefault((workload, c, name), [0, 0])
                    tally[0] += sum(t == ref for t, ref in zip(tokens, reference))
                    tally[1] += len(tokens)
                    rates[name].append(sum(map(len, tokens)) / wall)
                    tokens_out[name] += sum(map(len, tokens))
                    tpots[name].append(statistics.median(tpot))
                    t = spec_totals[name]
                    t[0] += spec[0]
                    t[1] += spec[1]
                    t[2] += spec[2]
                    t[3] = spec[3] if t[3] is None else [a + b for a, b in zip(t[3], spec[3])]
            off_rate, off_tpot = statistics.median(rates["off"]), statistics.median(tpots["off"])
            for name in configs:
                rate, tpot = statistics.median(rates[name]), statistics.median(tpots[name])
                drafts, draft_tokens, accepted, per_pos = spec_totals[name]
                acc = f"{100 * accepted / draft_tokens:.0f}" if draft_tokens else "–"
                pos = " / ".join(f"{100 * a / drafts:.0f}" for a in per_pos) if drafts else "–"
                per_step = tokens_per_step(spec_totals[name], tokens_out[name])
                print(f"| {workload} | {c} | {name} | {rate:.1f} | {1000 * tpot:.1f} | "
                      f"{rate / off_rate:.2f}x | {tpot / off_tpot:.2f}x | {per_step} | {acc} | "
                      f"{pos} |", flush=True)
    if args.dtype != "float32":
        print(f"\n{args.dtype}: requests whose output equals the round's first configuration's "
              "(greedy): " + "; ".join(f"{w} {c} {n} {a}/{b}" for (w, c, n), (a, b) in same.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
