"""Locust entry point for the `trace` workload: replay a trace at its arrival times.

Format, prompt construction and SLOs: loadtests/workloads/trace.py. Extra options:

  --trace-file PATH   the trace (JSONL)
  --trace-speed F     send request i at start + timestamp_i / F (2: twice the rate)

Open loop by nature: each request is sent at its time whatever the server's latency
(in flight capped by --max-inflight; one over the cap is recorded as dropped). One user
per process replays the process's share: a single process sends every request; with N
distributed workers, worker w sends requests i with i % N == w. Users beyond the first
in a process stay idle.

Distributed, only the master reads --trace-file: at the test's start it sends the trace
(zlib-compressed) to every worker as a custom message, ahead of the spawn messages on the
same connection, so a worker in another pod needs no copy of the file. A worker replays
only a trace it was sent (it waits up to SHIP_TIMEOUT s for it).

By hand: locust -f loadtests/trace.py --headless -u 1 -r 1 -t 60s --host URL
         --trace-file trace.jsonl --samples-file samples.jsonl
"""
import random
import time
import zlib

import gevent
from gevent.event import Event
import requests
from locust import events

from loadtests import distributed
from loadtests.common import StreamingUser, _state, _write, max_model_len
from loadtests.client import Sample
from loadtests.workloads.base import SingleShot
from loadtests.workloads.base import words
from loadtests.workloads.trace import (FALLBACK_TOKENS, WORKLOAD, build_request, parse_trace,
                                       read_trace)

_replaying: set = set()  # processes' first user (one replay per process)
TRACE_MESSAGE = "paged_trace"
SHIP_TIMEOUT = 60.0
_shipped: dict = {"event": Event(), "trace": None}  # a worker's trace, from the master


@events.init_command_line_parser.add_listener
def _add_trace_options(parser) -> None:
    parser.add_argument("--trace-file", default="", help="trace to replay (JSONL)")
    parser.add_argument("--trace-speed", type=float, default=1.0,
                        help="replay speed: arrival times are divided by it")


@events.init.add_listener
def _on_init(environment, **_) -> None:
    if distributed.role(environment) == "worker":
        environment.runner.register_message(TRACE_MESSAGE, _receive_trace)


def _receive_trace(environment, msg, **_) -> None:
    text = zlib.decompress(msg.data["trace"]).decode("utf-8")
    _shipped["trace"] = parse_trace(text, f"the trace {msg.data['name']} from the master")
    _shipped["event"].set()


@events.test_start.add_listener
def _ship_trace(environment, **_) -> None:
    """The master sends the trace to its workers before it spawns their users."""
    if distributed.role(environment) != "master":
        return
    path = environment.parsed_options.trace_file
    if not path:
        return  # the workers' users report the missing option
    with open(path, "rb") as f:
        data = zlib.compress(f.read(), 6)
    environment.runner.send_message(TRACE_MESSAGE, {"trace": data, "name": path})


def _trace(environment) -> list:
    """This process's copy of the trace: the file, or on a worker the master's message."""
    opts = environment.parsed_options
    if distributed.role(environment) != "worker":
        return read_trace(opts.trace_file)
    if not _shipped["event"].wait(timeout=SHIP_TIMEOUT):
        raise ValueError(f"no trace from the master within {SHIP_TIMEOUT:.0f} s")
    return _shipped["trace"]


def _vocab(host: str) -> tuple[int, ...]:
    """Ids of ordinary words in the server's tokenizer (/tokenize), else the fallback."""
    text = words(random.Random(0), 400)
    try:
        response = requests.post(host.rstrip("/") + "/tokenize", timeout=10,
                                 json={"prompt": text, "add_special_tokens": False})
        ids = tuple(sorted(set(response.json()["tokens"])))
        return ids if len(ids) >= 20 else FALLBACK_TOKENS
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return FALLBACK_TOKENS


class TraceUser(StreamingUser):
    workload = WORKLOAD
    always_ignore_eos = True  # the trace's output lengths are forced (max_tokens)

    def drive(self) -> None:
        if _replaying:  # another user of this process replays its share
            gevent.sleep(3600)
            return
        _replaying.add(self.user_id)
        opts = self.environment.parsed_options
        if not opts.trace_file:
            raise ValueError("the trace workload needs --trace-file")
        if not opts.trace_speed > 0:
            raise ValueError(f"--trace-speed must be positive, got {opts.trace_speed}")
        trace = _trace(self.environment)
        shards, shard = distributed.worker_count(self.environment), distributed.worker_index(
            self.environment)
        max_len, vocab = max_model_len(self.host), _vocab(self.host)
        t0, base = time.monotonic(), trace[0].timestamp
        for index, req in enumerate(trace):
            if index % shards != shard:
                continue
            request = build_request(req, index, seed=self.seed, scale=self.scale,
                                    max_model_len=max_len, vocab=vocab)
            gevent.sleep(max(0.0, t0 + (req.timestamp - base) / opts.trace_speed
                             - time.monotonic()))
            if len(_state["inflight"]) >= opts.max_inflight:
                _write(Sample(kind=request.kind, start=time.time(),
                              error="dropped: too many requests in flight").to_json())
                continue
            _state["inflight"].spawn(self._send, SingleShot(request), request)
        gevent.sleep(3600)  # the trace is over; Locust's run time ends the test
