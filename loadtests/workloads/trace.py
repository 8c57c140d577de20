"""trace: replay a request trace (JSONL) at its own arrival times (open loop).

Trace format, one JSON object per line (`python -m tuner trace` writes it from the
engine's `--request-log`; `--workload-from-prometheus` synthesises one):

  {"timestamp": 0.0, "prompt_tokens": 412, "output_tokens": 64,
   "prefix_group": "g1", "prefix_tokens": 256}

- `timestamp`: seconds from the start of the trace (arrival time); the replay sends
  request i at start + timestamp_i / speed, whatever the server's latency;
- `prompt_tokens`, `output_tokens`: lengths in tokens. Prompts are sent as token ids
  (/v1/completions accepts them), so the engine sees exactly these lengths; the output
  length is `max_tokens` with `ignore_eos` (the client always sets it), so it holds;
- `prefix_group` (optional): requests of one group share a generated common prefix of
  `prefix_tokens` tokens (a system prompt) and differ after it; without a group a prompt
  shares nothing.
Token ids are drawn from the server's own tokens for ordinary words (one /tokenize call
at the start, as vLLM and this engine serve it), else from FALLBACK_TOKENS; they mean
nothing, like the words of the synthetic workloads. Lengths scale with --length-scale; a request longer than the
server's max_model_len (from /v1/models) is shortened to fit, prompt first.
Default SLOs: chat's (TTFT <= 1.0 s, TPOT <= 0.1 s); set the service's own with --slo.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtests.workloads.base import Request, WorkloadSpec

FALLBACK_TOKENS = tuple(range(10, 500))  # ordinary ids in most vocabularies (>= 609)
KIND = "trace"


@dataclass(frozen=True)
class TraceRequest:
    timestamp: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: str | None = None
    prefix_tokens: int = 0

    def to_json(self) -> str:
        record = asdict(self)
        if self.prefix_group is None:
            del record["prefix_group"], record["prefix_tokens"]
        return json.dumps(record)


def _field(record: dict, name: str, where: str, *, minimum: float) -> float:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ValueError(f"{where}: {name} must be a number >= {minimum:g}, got {value!r}")
    return value


def parse_trace_line(line: str, where: str) -> TraceRequest:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object")
    group = record.get("prefix_group")
    if group is not None and not isinstance(group, str):
        raise ValueError(f"{where}: prefix_group must be a string, got {group!r}")
    prefix = int(_field(record, "prefix_tokens", where, minimum=0)) \
        if "prefix_tokens" in record else 0
    return TraceRequest(timestamp=float(_field(record, "timestamp", where, minimum=0)),
                        prompt_tokens=int(_field(record, "prompt_tokens", where, minimum=1)),
                        output_tokens=int(_field(record, "output_tokens", where, minimum=1)),
                        prefix_group=group, prefix_tokens=prefix if group is not None else 0)


def read_trace(path: str | Path) -> list[TraceRequest]:
    """The trace's requests in arrival order; ValueError naming the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"trace {path}: cannot read it ({exc.strerror})") from None
    return parse_trace(text, f"trace {path}")


def parse_trace(text: str, where: str) -> list[TraceRequest]:
    """A trace's text (JSONL) as requests in arrival order; `where` names it in errors."""
    requests = [parse_trace_line(line, f"{where} line {n}")
                for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not requests:
        raise ValueError(f"{where} holds no requests")
    return sorted(requests, key=lambda r: r.timestamp)


def write_trace(path: str | Path, requests: list[TraceRequest]) -> None:
    Path(path).write_text("".join(r.to_json() + "\n" for r in requests), encoding="utf-8")


def trace_rate(requests: list[TraceRequest]) -> float:
    """Mean arrival rate (requests/s) over the trace's span."""
    span = requests[-1].timestamp - requests[0].timestamp
    return (len(requests) - 1) / span if span > 0 else float(len(requests))


def _tokens(rng: random.Random, n: int, vocab: tuple[int, ...]) -> list[int]:
    return [rng.choice(vocab) for _ in range(n)]


def fit_lengths(prompt: int, output: int, max_model_len: int | None) -> tuple[int, int]:
    """Shorten (prompt first, keeping one token) so prompt + output < max_model_len."""
    if max_model_len is None or prompt + output < max_model_len:
        return prompt, output
    prompt = max(1, max_model_len - output - 1)
    return prompt, max(1, min(output, max_model_len - prompt - 1))


def build_request(req: TraceRequest, index: int, *, seed: int = 0, scale: float = 1.0,
                  max_model_len: int | None = None,
                  vocab: tuple[int, ...] = FALLBACK_TOKENS) -> Request:
    """Request `index` of a trace: its group's shared prefix, then tokens of its own."""
    prompt, output = fit_lengths(max(1, round(req.prompt_tokens * scale)),
                                 max(1, round(req.output_tokens * scale)), max_model_len)
    shared = 0
    ids: list[int] = []
    if req.prefix_group is not None:
        shared = min(prompt, round(req.prefix_tokens * scale))
        ids = _tokens(random.Random(f"{seed}:group:{req.prefix_group}"), shared, vocab)
    ids += _tokens(random.Random(f"{seed}:request:{index}"), prompt - shared, vocab)
    return Request(KIND, "/v1/completions", {"prompt": ids, "max_tokens": output})


def _no_sessions(rng: random.Random, scale: float):
    raise ValueError("the trace workload replays its trace at the trace's arrival times "
                     "(loadtests/trace.py); it has no sessions to draw")


WORKLOAD = WorkloadSpec(
    name="trace",
    description="a recorded (or fitted) trace replayed at its arrival times",
    new_session=_no_sessions,
    slos={KIND: {"ttft": 1.0, "tpot": 0.1}},
    primary_latency="ttft",
    users=1,
)
