#!/usr/bin/env python
"""Why a `precise` router's requests missed the cache: its decision log, classified.

    python benchmarks/routing_decisions.py /tmp/bench_routing/router-precise-0-*.log [--skip 32]

Reads the JSON lines a router writes with `--log-decisions` (bench_routing.py passes it)
and sorts each request after the first `--skip` (the warm-up) by what its pick held of its
prefix, by the router's index at the moment of the decision:

- `best holder`: the pick held the most any replica held (what is left are the blocks no
  replica had: the request's own end);
- `holder full`: a replica held more, but was at its load bound;
- `first seen`: no replica held any of it and no earlier request had this first block;
- `evicted`: no replica held any of it, though an earlier request had it more than
  `--recent` seconds before;
- `not yet stored`: the same, within `--recent` seconds of an earlier request with this
  first block (the index had not yet heard of the blocks that request stored).

Prints a line per request that was not a best-holder pick, then per class the requests and
the blocks they found uncached.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter


def classify(rows: list[dict], skip: int, recent: float) -> list[tuple[int, str, dict]]:
    last: dict[str, float] = {}
    out = []
    for i, r in enumerate(rows):
        held = r["held"][r["backends"].index(r["pick"])]
        best, before = max(r["held"]), last.get(r["key"])
        if best > 0 and held == best:
            kind = "best holder"
        elif best > held:
            kind = "holder full"
        elif before is None:
            kind = "first seen"
        else:
            kind = "not yet stored" if r["t"] - before < recent else "evicted"
        last[r["key"]] = r["t"]
        if i >= skip:
            out.append((i, kind, r))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log")
    p.add_argument("--skip", type=int, default=32, help="warm-up requests to leave out")
    p.add_argument("--recent", type=float, default=2.0, help="seconds: see `not yet stored`")
    args = p.parse_args()
    with open(args.log) as f:
        rows = [json.loads(line[line.index("{"):]) for line in f
                if "paged_router.decisions" in line and "{" in line]
    requests, blocks = Counter(), Counter()
    for i, kind, r in classify(rows, args.skip, args.recent):
        held = r["held"][r["backends"].index(r["pick"])]
        requests[kind] += 1
        blocks[kind] += r["blocks"] - held
        if kind != "best holder":
            print(f"{i}: {kind}, {r['decision']}: held {r['held']}, in flight {r['in_flight']}, "
                  f"bounds {r['bound']}/{r['hit_bound']}, footprint {r['footprint']}, "
                  f"{r['blocks']} blocks")
    print("| class | requests | blocks not cached at the pick |\n|---|---:|---:|")
    for kind, n in requests.most_common():
        print(f"| {kind} | {n} | {blocks[kind]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
