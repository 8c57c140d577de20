#!/usr/bin/env python
"""Chaos soak of `python -m engine serve`: does anything take the server down or leak?

Starts a server (tiny default model unless --model), then for --duration seconds runs at
once: Locust's `mixed` workload (headless), clients that disconnect mid-stream at random,
bad requests (issue 11's reproducers and malformed bodies), slow SSE readers (a tiny
receive buffer and long pauses between reads) and slow-header connections. Then it waits
for the server to go idle and prints one table:

  requests and the status histogram (from the server's access log: every request, Locust
  included), 5xx (503 queue-full aside: unexpected), engine step failures and whether the
  engine is still serving, leaked KV blocks (`paged:num_used_blocks` when idle), the
  largest per-request output backlog against its bound, slow readers aborted, and the
  server's RSS at start / peak / end (glibc may keep freed memory: RSS is reported as seen).

Exit status 1 when the engine died, any unexpected 5xx was answered, a block leaked or a
backlog exceeded its bound.

  python benchmarks/soak.py --duration 600 --users 16          # the README's 10-minute run
  python benchmarks/soak.py --duration 20 --users 4            # what tests/server runs in CI
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
BACKLOG_LIMIT = 256  # --max-stream-backlog-tokens of the soaked server
MAX_NUM_SEQS = 16
BAD_BODIES = [
    '{"prompt":"hi","max_tokens":5,"min_tokens":2,"stop_token_ids":[100000000]}',
    '{"prompt":"hi","max_tokens":5,"min_tokens":2,"stop_token_ids":[-100000]}',
    '{"prompt":"hi","max_tokens":3,"temperature":1,"seed":18446744073709551616}',
    '{"prompt":"hi","max_tokens":3,"temperature":1,"n":2,"seed":18446744073709551615}',
    '{"prompt":"hi","max_tokens":3,"temperature":1,"top_k":9223372036854775808}',
    '{"prompt":"hi","repetition_penalty":NaN,"logprobs":2}',
    '{"prompt":"\\ud800\\udfff\\ud800"}', '{"prompt": "hi",', '["hi"]', '{}',
    '{"prompt":"hi","max_tokens":4,"temperature":0.9,"top_p":0.5,"top_k":4,"min_p":0.1}',
]


class Server:
    def __init__(self, extra: list[str]) -> None:
        cmd = [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1", "--port", "0",
               "--max-model-len", "1024", "--max-num-seqs", str(MAX_NUM_SEQS),
               "--num-gpu-blocks-override", "512", "--max-stream-backlog-tokens",
               str(BACKLOG_LIMIT), "--header-read-timeout", "2", "--cpu-threads", "1", *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.statuses: collections.Counter[int] = collections.Counter()
        self.tracebacks = 0
        bound = threading.Event()
        self.url = ""

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if m := re.match(r"serving on (http://\S+)", line):
                    self.url = m.group(1)
                    bound.set()
                elif m := re.search(r'"(?:GET|POST) [^"]*" (\d{3}) ', line):
                    self.statuses[int(m.group(1))] += 1
                elif line.startswith("Traceback"):
                    self.tracebacks += 1

        threading.Thread(target=pump, daemon=True).start()
        if not bound.wait(120):
            raise SystemExit("the server did not start")
        deadline = time.monotonic() + 300
        while httpx.get(self.url + "/health").status_code != 200:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("the server never became healthy")
            time.sleep(0.3)

    def metrics(self) -> dict[str, float]:
        """Each sample's value summed over its label sets."""
        out: dict[str, float] = collections.defaultdict(float)
        text = httpx.get(self.url + "/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] += sample.value
        return out

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _disconnector(url: str, stop: threading.Event, rng: random.Random) -> None:
    while not stop.is_set():
        body = {"prompt": "tell me a long story", "max_tokens": rng.randint(20, 300),
                "stream": rng.random() < 0.7, "n": rng.choice([1, 1, 2]), "ignore_eos": True}
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body,
                              timeout=rng.uniform(0.2, 2.0)) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError:
            pass  # the point: leaving early


def _bad_requester(url: str, stop: threading.Event, rng: random.Random) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stop.is_set():
            path = rng.choice(["/v1/completions", "/v1/completions", "/tokenize"])
            try:
                http.post(path, content=rng.choice(BAD_BODIES).encode(),
                          headers={"Content-Type": "application/json"})
            except httpx.HTTPError:
                pass
            stop.wait(0.05)


def _slow_reader(port: int, stop: threading.Event, rng: random.Random) -> None:
    body = json.dumps({"prompt": "go on", "max_tokens": 600, "stream": True, "n": 2,
                       "logprobs": 20, "ignore_eos": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    while not stop.is_set():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(request)
            sock.settimeout(30)
            for _ in range(rng.randint(5, 40)):  # a few reads, a pause after each
                if not sock.recv(512) or stop.wait(0.5):
                    break
        except OSError:
            pass
        finally:
            sock.close()


def _slow_header(port: int, stop: threading.Event, rng: random.Random) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\n")
                while not stop.wait(0.5):
                    sock.sendall(b"X")  # never completes its headers
        except OSError:
            pass  # closed by the header-read timeout: start another


def _locust(url: str, users: int, seconds: float, workdir: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "locust", "-f", "loadtests/mixed.py", "--headless",
           "-u", str(users), "-r", str(users), "-t", f"{max(1, int(seconds))}s",
           "--stop-timeout", "30", "--host", url, "--length-scale", "0.2", "--only-summary",
           "--csv", os.path.join(workdir, "locust")]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def soak(duration: float, users: int, chaos: int, seed: int, extra: list[str]) -> int:
    server = Server(extra)
    pid = psutil.Process(server.proc.pid)
    rss = [pid.memory_info().rss]
    port = int(server.url.rsplit(":", 1)[1])
    stop = threading.Event()
    rng = random.Random(seed)
    workers = [threading.Thread(target=fn, args=(arg, stop, random.Random(rng.random())),
                                daemon=True)
               for fn, arg in [(_disconnector, server.url), (_bad_requester, server.url),
                               (_slow_reader, port), (_slow_header, port)]
               for _ in range(chaos)]
    with tempfile.TemporaryDirectory() as workdir:
        locust = _locust(server.url, users, duration, workdir)
        for w in workers:
            w.start()
        t_end = time.monotonic() + duration
        while time.monotonic() < t_end:
            rss.append(pid.memory_info().rss)
            time.sleep(0.5)
        stop.set()
        locust.wait(120)
        for w in workers:
            w.join(40)
    deadline = time.monotonic() + 60  # idle: every stream ended, its blocks freed
    while (m := server.metrics())["vllm:num_requests_running"] + \
            m["vllm:num_requests_waiting"] > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1.0)
    m, healthy = server.metrics(), httpx.get(server.url + "/health").status_code == 200
    served = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                        timeout=60).status_code == 200
    rss.append(pid.memory_info().rss)
    exit_code = server.stop()
    statuses = server.statuses
    unexpected_5xx = sum(n for s, n in statuses.items() if s >= 500 and s != 503)
    leaked = int(m["paged:num_used_blocks"])
    backlog, bound = int(m["paged:max_stream_backlog_tokens"]), BACKLOG_LIMIT + MAX_NUM_SEQS
    rows = [
        ("duration (s)", f"{duration:.0f}"),
        ("requests (access log)", f"{sum(statuses.values())}"),
        ("status histogram", " ".join(f"{s}:{n}" for s, n in sorted(statuses.items()))),
        ("5xx (503 queue-full aside)", f"{unexpected_5xx}"),
        ("engine step failures", f"{int(m['paged:engine_step_failures_total'])}"),
        ("engine alive, /health 200, serves after", f"{healthy and served}"),
        ("leaked KV blocks (idle)", f"{leaked}"),
        ("max output backlog / bound (tokens)", f"{backlog} / {bound}"),
        ("slow readers aborted", f"{int(m['paged:slow_reader_aborts_total'])}"),
        ("RSS start / peak / end (MiB)",
         " / ".join(f"{x / 2**20:.0f}" for x in (rss[0], max(rss), rss[-1]))),
        ("tracebacks in the server log", f"{server.tracebacks}"),
        ("server exit status after SIGTERM", f"{exit_code}"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows), flush=True)
    ok = (healthy and served and unexpected_5xx == 0 and leaked == 0 and backlog <= bound
          and exit_code == 0)
    print("soak: OK" if ok else "soak: FAILED", flush=True)
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600, help="seconds of load")
    p.add_argument("--users", type=int, default=16, help="Locust users (mixed workload)")
    p.add_argument("--chaos", type=int, default=2,
                   help="threads of each chaos kind (disconnects, bad requests, slow readers, "
                        "slow headers)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("server_args", nargs=argparse.REMAINDER,
                   help="after --: more `engine serve` flags (e.g. a MODEL)")
    args = p.parse_args()
    extra = [a for a in args.server_args if a != "--"]
    return soak(args.duration, args.users, args.chaos, args.seed, extra)


if __name__ == "__main__":
    sys.exit(main())
