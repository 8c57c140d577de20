"""bench_spec_decode.py --tuned: the tuner's choice of num_speculative_tokens against off.

Per workload and concurrency, in two phases on different requests:

1. Choice, on calibration requests (seeds 1000 + r): every value of the tuner's own search
   range for num_speculative_tokens (api/paged_api/search_space.py: the settings table's `tune`, 0 =
   off) serves the same max(3, concurrency) requests, configurations in turn, for
   `--calibration-rounds` rounds (3 by default: with 2, Student's t of 12.7 leaves
   intervals too wide for any but huge, steady gains); the tuner's own statistics (tuner/search/stats.py) turn the per-round output
   tok/s into paired gains over off with 95 % intervals, and its decision rule picks the
   candidate with the highest lower bound above 1, else keeps off (0).
2. Measurement, on held-out requests (seeds 0 .. rounds - 1, the plain table's): off and
   the chosen value, in turn, order alternating, medians over rounds.

So the choice is never scored on the data that chose it. The n-gram lookup bounds are the
run's --prompt-lookup (the tuner searches only the number of drafts here).
"""
from __future__ import annotations

import statistics

from paged_api.search_space import SETTINGS, engine_values, parse_param
from tuner.search.stats import decide, paired_gain


def candidates() -> list[int | str]:
    """The tuner's default range for num_speculative_tokens: 0 = off, K = n-gram with K
    drafts, "suffix:K" = suffix decoding with at most K."""
    name = "num_speculative_tokens"
    return parse_param(name, SETTINGS[name].tune).grid_values()


def spec_config(k: int | str, lo: int, hi: int) -> dict | None:
    """A trial's engine settings for k (the tuner's mapping); n-gram gets the lookup bounds."""
    spec = engine_values({"num_speculative_tokens": k})["speculative_config"]
    if spec is None or spec["method"] != "ngram":
        return spec
    return {**spec, "prompt_lookup_min": lo, "prompt_lookup_max": hi}


def choose(serve, ks: list, rounds: int) -> tuple[int | str, str]:
    """serve(k, round) -> output tok/s on that round's calibration requests."""
    rates: dict[int, list[float]] = {k: [] for k in ks}
    for r in range(rounds):
        for k in (ks if r % 2 == 0 else ks[::-1]):
            rates[k].append(serve(k, r))
    base = rates[0]
    label = {f"k={k}": k for k in ks if k}
    gains = {name: paired_gain(base, rates[k], floor=1e-6) for name, k in label.items()}
    decision = decide(gains)
    chosen = label[decision.winner] if decision.winner else 0
    shown = ", ".join(f"{label} {g.text()}" for label, g in gains.items())
    return chosen, f"{shown} -> {decision.reason}"


def _spec_columns(spec: tuple, out_tokens: int, requests: int) -> tuple[str, str, str, str]:
    """accepted %, per position, share of decode steps with drafts, tokens per step."""
    drafts, draft_tokens, accepted, per_pos = spec
    if not draft_tokens:
        return "–", "–", "0", "1.00"
    rows = out_tokens - accepted - requests  # decode rows (each made 1 + accepted tokens)
    return (f"{100 * accepted / draft_tokens:.0f}",
            " / ".join(f"{100 * a / drafts:.0f}" for a in per_pos),
            f"{100 * drafts / rows:.0f}", f"{(out_tokens - requests) / rows:.2f}")


def run(args, engine_for, texts_for, run_closed_loop, levels: list[int]) -> None:
    """engine_for(k) -> an engine; texts_for(workload, count, seed) -> prompts."""
    ks = candidates()
    print("| workload | conc | config | out tok/s | TPOT ms | tok/s vs off | TPOT vs off | "
          "accepted % | accepted % per position | steps with drafts % | tokens per step |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|")
    choices = []
    for workload in args.workloads.split(","):
        for c in levels:
            n_cal = max(3, c)

            def serve(k, r):
                texts = texts_for(workload, n_cal, 1000 + r)
                wall, outs, _, _ = run_closed_loop(engine_for(k), texts, c, args.max_tokens,
                                                   f"cal{workload}{c}k{k}r{r}")
                return sum(len(o.outputs[0].token_ids) for o in outs) / wall

            chosen, why = choose(serve, ks, args.calibration_rounds)
            choices.append(f"{workload} @ {c}: k={chosen} ({why})")
            n = args.requests or max(4, c)
            configs = [0] if chosen == 0 else [0, chosen]
            rates = {k: [] for k in configs}
            tpots = {k: [] for k in configs}
            totals = {k: [0, 0, 0, None, 0] for k in configs}
            for r in range(args.rounds):
                texts = texts_for(workload, n, r)
                reference = None
                for k in (configs if r % 2 == 0 else configs[::-1]):
                    wall, outs, tpot, spec = run_closed_loop(engine_for(k), texts, c,
                                                             args.max_tokens,
                                                             f"{workload}{c}k{k}r{r}")
                    tokens = [o.outputs[0].token_ids for o in outs]
                    reference = reference or tokens
                    assert tokens == reference, f"k={k} changed the greedy output"
                    rates[k].append(sum(map(len, tokens)) / wall)
                    tpots[k].append(statistics.median(tpot))
                    t = totals[k]
                    for i in range(3):
                        t[i] += spec[i]
                    t[3] = spec[3] if t[3] is None else [a + b for a, b in zip(t[3], spec[3])]
                    t[4] += sum(map(len, tokens))
            off_rate, off_tpot = statistics.median(rates[0]), statistics.median(tpots[0])
            for k in configs:
                rate, tpot = statistics.median(rates[k]), statistics.median(tpots[k])
                t = totals[k]
                acc, pos, drafted, per_step = _spec_columns(tuple(t[:3]) + (t[3] or [],),
                                                            t[4], n * args.rounds)
                name = "off" if k == 0 else f"tuned k={k}"
                print(f"| {workload} | {c} | {name} | {rate:.1f} | {1000 * tpot:.1f} | "
                      f"{rate / off_rate:.2f}x | {tpot / off_tpot:.2f}x | {acc} | {pos} | "
                      f"{drafted} | {per_step} |", flush=True)
            if chosen == 0:
                print(f"| {workload} | {c} | tuned k=0 (= off) | {off_rate:.1f} | "
                      f"{1000 * off_tpot:.1f} | 1.00x | 1.00x | – | – | 0 | 1.00 |", flush=True)
    print("\nChoices (calibration requests; gains over off, 95 % intervals):")
    for line in choices:
        print(f"- {line}")
