"""Streaming OpenAI client that times every SSE chunk (no Locust import).

TTFT is the time from sending the request to the first chunk that carries a token;
inter-token latencies (ITL) are the gaps between successive token chunks (the server
streams one chunk per engine step, i.e. per token). All times come from
`time.perf_counter()` and are kept unrounded, unlike Locust's own statistics.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import requests


@dataclass
class Sample:
    """One request as the client saw it; a line of the samples file (JSON)."""

    kind: str
    start: float                   # wall-clock (time.time()) when the request was sent
    ok: bool = False
    error: str | None = None
    status: int | None = None
    ttft: float | None = None      # seconds
    e2e: float | None = None       # seconds, request sent -> stream finished
    itl: list[float] = field(default_factory=list)  # seconds between text chunks
    output_tokens: int = 0         # usage.completion_tokens when sent, else text chunks
    prompt_tokens: int | None = None
    text: str = ""

    def to_json(self) -> str:
        record = asdict(self)
        record.pop("text")
        return json.dumps(record)


def _chunk_token(event: dict) -> str | None:
    """The output text of one SSE event, or None when it carries no token.

    A token's text may be "" (the detokenizer holds back an incomplete UTF-8 sequence), so
    presence of the field counts, not its content. The chat stream's opening chunk that
    only announces the assistant role is not a token."""
    text = None
    for choice in event.get("choices") or []:
        delta = choice.get("delta")
        if "text" in choice:
            text = (text or "") + (choice["text"] or "")
        elif delta is not None and "content" in delta and "role" not in delta:
            text = (text or "") + (delta["content"] or "")
    return text


def stream_request(session: requests.Session, base_url: str, path: str, body: dict, *,
                   kind: str, model: str | None, timeout: float = 600.0,
                   ignore_eos: bool = True) -> Sample:
    """POST `body` with stream=True to `base_url + path`, timing each SSE chunk.

    `ignore_eos` (the default) sends `ignore_eos: true`, so a reply is exactly `max_tokens`
    long (the workload's length, whatever the model); False sends no such field, so the
    model's EOS ends the reply and `max_tokens` is only a cap.
    Never raises for HTTP or protocol errors: they come back as `Sample(ok=False)`.
    """
    payload = dict(body, stream=True, stream_options={"include_usage": True})
    if ignore_eos:
        payload["ignore_eos"] = True
    if model:
        payload["model"] = model
    sample = Sample(kind=kind, start=time.time())
    t0 = time.perf_counter()
    last = None
    try:
        with session.post(base_url.rstrip("/") + path, json=payload, stream=True,
                          timeout=timeout) as response:
            sample.status = response.status_code
            if response.status_code != 200:
                sample.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return sample
            pieces, done, buffer = [], False, b""
            # chunk_size=None: yield bytes as they arrive (one HTTP chunk per SSE event).
            for raw in response.iter_content(chunk_size=None):
                now = time.perf_counter()
                buffer += raw
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    data = event.decode("utf-8", "replace").strip()
                    if not data.startswith("data:"):
                        continue
                    data = data[len("data:"):].strip()
                    if data == "[DONE]":
                        done = True
                        continue
                    parsed = json.loads(data)
                    if "error" in parsed:
                        sample.error = f"stream error: {parsed['error']}"[:300]
                        return sample
                    text = _chunk_token(parsed)
                    if text is not None:
                        if last is None:
                            sample.ttft = now - t0
                        else:
                            sample.itl.append(now - last)
                        last = now
                        sample.output_tokens += 1
                        pieces.append(text)
                    usage = parsed.get("usage")
                    if usage:
                        sample.output_tokens = usage.get("completion_tokens", sample.output_tokens)
                        sample.prompt_tokens = usage.get("prompt_tokens")
            sample.e2e = time.perf_counter() - t0
            sample.text = "".join(pieces)
            if not done:
                sample.error = "stream ended without [DONE]"
            elif sample.ttft is None:
                sample.error = "no output tokens"
            else:
                sample.ok = True
    except (requests.RequestException, ValueError) as exc:  # ValueError: bad JSON chunk
        sample.error = f"{type(exc).__name__}: {exc}"[:300]
    return sample
