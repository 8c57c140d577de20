"""`python -m tuner trace LOG... -o trace.jsonl`: the engine's request log as a trace.

The engine's `--request-log` (engine/entrypoints/request_log.py) holds per request its
arrival time, prompt and output token counts, finish reason and hashes of the first
N·2^k prompt tokens. The trace (loadtests/workloads/trace.py) keeps:

- `timestamp`: arrival time minus the first request's (logs of several replicas merge
  by arrival time);
- `prompt_tokens`, `output_tokens` as logged (an aborted request keeps the tokens it got,
  at least 1);
- `prefix_group`: requests whose first N prompt tokens hash alike (N = the log's
  prefix_tokens), when at least `min_group` requests share it; `prefix_tokens`: the
  longest logged depth N·2^k at which every member long enough agrees, so the shared
  prefix is known to a factor of two, rounded down (nested sharing, e.g. one
  conversation's turns inside a shared system prompt, is kept at the outer level only).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from loadtests.workloads.trace import TraceRequest, trace_rate


def read_request_log(paths: list[str | Path]) -> list[dict]:
    """The logged requests of every file, by arrival time; ValueError naming file:line."""
    records = []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ValueError(f"request log {path}: cannot read it ({exc.strerror})") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                ok = (isinstance(record["ts"], (int, float))
                      and int(record["prompt_tokens"]) >= 1
                      and int(record["output_tokens"]) >= 0
                      and isinstance(record.get("prefix_hashes", []), list))
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                raise ValueError(f"request log {path} line {n}: expected the engine's "
                                 "--request-log JSON (ts, prompt_tokens, output_tokens, "
                                 "prefix_hashes)")
            records.append(record)
    if not records:
        raise ValueError(f"request log {', '.join(map(str, paths))}: no requests logged")
    return sorted(records, key=lambda r: r["ts"])


def _shared_depth(members: list[dict]) -> int:
    """Longest logged depth at which every member that reaches it has the same hash."""
    base = members[0].get("prefix_tokens", 1)
    depth_index = 0
    while True:
        k = depth_index + 1
        reach = [m["prefix_hashes"][k] for m in members if len(m["prefix_hashes"]) > k]
        if len(reach) < 2 or len(set(reach)) > 1:
            return base * 2 ** depth_index
        depth_index = k


def log_to_trace(records: list[dict], *, min_group: int = 2) -> list[TraceRequest]:
    """Trace requests from request-log records (sorted by arrival time)."""
    if min_group < 2:
        raise ValueError(f"--min-group must be >= 2 (a group of one shares nothing), "
                         f"got {min_group}")
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("prefix_hashes"):
            groups[record["prefix_hashes"][0]].append(record)
    names, depths = {}, {}
    for key, members in sorted(groups.items(), key=lambda kv: kv[1][0]["ts"]):
        if len(members) >= min_group:
            names[key] = f"g{len(names)}"
            depths[key] = _shared_depth(members)
    t0 = records[0]["ts"]
    out = []
    for record in records:
        key = (record.get("prefix_hashes") or [None])[0]
        group = names.get(key)
        out.append(TraceRequest(
            timestamp=round(record["ts"] - t0, 4), prompt_tokens=int(record["prompt_tokens"]),
            output_tokens=max(1, int(record["output_tokens"])), prefix_group=group,
            prefix_tokens=depths[key] if group else 0))
    return out


def _quantiles(values: list[float]) -> str:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return (f"p10 {q(0.1):.0f}, p50 {q(0.5):.0f}, p90 {q(0.9):.0f}, max {ordered[-1]:.0f}, "
            f"mean {sum(ordered) / len(ordered):.1f}")


def describe_trace(trace: list[TraceRequest], *, source: str,
                   assumed: list[str] | None = None) -> dict:
    """The workload document of a trace: what was inferred and what was assumed."""
    span = trace[-1].timestamp - trace[0].timestamp
    grouped = [r for r in trace if r.prefix_group]
    sizes = Counter(r.prefix_group for r in grouped)
    shared = {r.prefix_group: r.prefix_tokens for r in grouped}
    inferred = [
        f"{len(trace)} requests over {span:.1f} s: mean arrival rate {trace_rate(trace):.3f} "
        "req/s, replayed at the recorded arrival times",
        f"prompt tokens: {_quantiles([r.prompt_tokens for r in trace])}",
        f"output tokens: {_quantiles([r.output_tokens for r in trace])}",
        f"prefix groups: {len(sizes)} holding {len(grouped)} of {len(trace)} requests"
        + (f"; sizes {dict(sizes.most_common(5))}; shared prefix tokens "
           f"{dict(list(shared.items())[:5])}" if sizes else ""),
    ]
    default_assumed = [
        "prompt content: random token ids (the log holds no text); only lengths and "
        "shared prefixes are reproduced",
        "a group's shared prefix is known to a factor of two (logged depths N*2^k), "
        "rounded down",
        "output lengths are forced with max_tokens and ignore_eos",
    ]
    return {"source": source, "inferred": inferred,
            "assumed": assumed if assumed is not None else default_assumed}


def render_document(doc: dict) -> str:
    lines = [f"# workload: {doc['source']}", "", "inferred:"]
    lines += [f"- {item}" for item in doc["inferred"]]
    lines += ["", "assumed:"]
    lines += [f"- {item}" for item in doc["assumed"]]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    """`python -m tuner trace LOG... -o FILE [--min-group N]`."""
    import sys

    from loadtests.workloads.trace import write_trace

    try:
        trace = log_to_trace(read_request_log(args.logs), min_group=args.min_group)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_trace(args.out, trace)
    print(render_document(describe_trace(trace, source=f"request log {', '.join(args.logs)}")))
    print(f"written to {args.out}")
    return 0
