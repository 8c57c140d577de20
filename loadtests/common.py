"""The Locust side of every workload: options, the streaming user, the samples file.

Locust is run headless by the tuner (`locust -f loadtests/chat.py --headless -u N ...`);
it can also be run by hand, with or without its web UI. Extra options:

  --samples-file PATH   append one JSON line per request (loadtests.client.Sample) plus
                        {"event": "start"|"stop", "t": ...} markers; the tuner reads it
  --seed N              seeds every prompt generator (same seed, same request stream)
  --arrival closed|open closed: each user sends its next request when the previous one
                        is done (-u sets the concurrency); open: Poisson arrivals at
                        --rate requests/s in total, split over the -u users, whatever
                        the server's latency (requests in flight capped by --max-inflight)
  --length-scale F      multiply every prompt/output length of the workload by F
  --model-name NAME     the OpenAI "model" field (default: the first of /v1/models)
  --real-eos            let the model's EOS end replies (max_tokens is a cap); without it
                        every request sends ignore_eos, so replies are the workload's
                        lengths exactly (the trace workload always sends it)
  --users-total N       open loop in distributed mode: the -u of the whole run (workers
                        get the master's custom options but not its -u)
Environment: PAGED_API_KEY, when set, is sent as `Authorization: Bearer KEY` (an engine
started with --api-key).
Distributed mode (--master / --worker): loadtests/distributed.py; the master alone writes
the samples file, merged from every worker's samples.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import time

import gevent
import requests
from gevent.pool import Group
from locust import User, constant, events

from loadtests import distributed
from loadtests.client import Sample, stream_request
from loadtests.workloads.base import OpenLoop, WorkloadSpec, park

_user_ids = itertools.count()
# file: the samples file (single process, or the master); shipper: a distributed worker's
# sink (loadtests/distributed.py); collector: the master's receiver of workers' lines.
_state: dict = {"file": None, "inflight": Group(), "model": None, "shipper": None,
                "collector": None}


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    parser.add_argument("--samples-file", default="", help="JSON-lines file for raw samples")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt generators")
    parser.add_argument("--arrival", choices=("closed", "open"), default="closed")
    parser.add_argument("--rate", type=float, default=1.0, help="open loop: requests/s in total")
    parser.add_argument("--max-inflight", type=int, default=512, help="open loop: cap")
    parser.add_argument("--length-scale", type=float, default=1.0)
    parser.add_argument("--model-name", default="", help="OpenAI model field")
    parser.add_argument("--real-eos", action="store_true",
                        help="no ignore_eos: the model's EOS ends replies (max_tokens caps)")
    parser.add_argument("--users-total", type=int, default=0,
                        help="open loop: users over all workers (distributed mode; workers do "
                             "not receive -u), default -u")


def _write(record: str) -> None:
    if _state["shipper"] is not None:
        _state["shipper"].write(record)
    elif _state["file"] is not None:
        _state["file"].write(record + "\n")
        _state["file"].flush()  # the tuner reads the file while the test runs


@events.init.add_listener
def _on_init(environment, **_) -> None:
    role = distributed.role(environment)
    if role == "master":
        _state["collector"] = distributed.MasterCollector(environment, _write)
    elif role == "worker":
        distributed.install_worker(environment)


@events.test_start.add_listener
def _on_start(environment, **_) -> None:
    if distributed.role(environment) == "worker":
        if _state["shipper"] is None:
            _state["shipper"] = distributed.WorkerShipper(environment)
        return
    path = getattr(environment.parsed_options, "samples_file", "") if environment.parsed_options else ""
    if path and _state["file"] is None:
        _state["file"] = open(path, "a", encoding="utf-8")
    _write(json.dumps({"event": "start", "t": time.time()}))


@events.test_stop.add_listener
def _on_stop(environment, **_) -> None:
    _state["inflight"].kill()  # open-loop requests still running record themselves
    if _state["shipper"] is not None:  # a worker: its last lines go to the master
        _state["shipper"].close()
        _state["shipper"] = None
        return
    stopped_at = time.time()
    if _state["collector"] is not None:  # the master: wait for the workers' last lines
        stopped_at = _state["collector"].drain()
    _write(json.dumps({"event": "stop", "t": stopped_at}))
    if _state["file"] is not None:
        _state["file"].close()
        _state["file"] = None


def auth_headers() -> dict[str, str]:
    """`Authorization: Bearer $PAGED_API_KEY` for a server started with --api-key (the
    in-cluster tuner sets it from the target's apiKeySecretRef); none when unset."""
    key = os.environ.get("PAGED_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _model_name(host: str, options) -> str | None:
    if options is not None and options.model_name:
        return options.model_name
    if _state["model"] is None:
        try:
            data = requests.get(host.rstrip("/") + "/v1/models", headers=auth_headers(),
                                timeout=10).json()["data"]
            _state["model"] = data[0]["id"]
        except (requests.RequestException, ValueError, KeyError, IndexError):
            _state["model"] = ""  # let the server pick its only model
    return _state["model"] or None


def max_model_len(host: str) -> int | None:
    """The served model's context length (/v1/models' max_model_len), asked once; None if
    the server does not say (then the workloads' word limits alone bound a history)."""
    if "max_model_len" not in _state:
        try:
            data = requests.get(host.rstrip("/") + "/v1/models", headers=auth_headers(),
                                timeout=10).json()["data"]
            value = data[0].get("max_model_len")
            _state["max_model_len"] = int(value) if value else None
        except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
            _state["max_model_len"] = None
    return _state["max_model_len"]


class StreamingUser(User):
    """A Locust user that replays a workload's sessions over streaming requests."""

    abstract = True
    workload: WorkloadSpec
    always_ignore_eos = False  # True: lengths must hold whatever --real-eos (a trace)
    wait_time = constant(0)
    tasks = [lambda user: user.drive()]  # late-bound, so a subclass's drive() is the task

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.seed = opts.seed if opts is not None else 0
        self.scale = opts.length_scale if opts is not None else 1.0
        self.ignore_eos = self.always_ignore_eos or not (opts is not None and opts.real_eos)
        self.user_id = next(_user_ids) + distributed.USER_ID_STRIDE * distributed.worker_index(
            self.environment)
        self.rng = random.Random(self.seed * 100_003 + self.user_id)
        self.http = requests.Session()
        self.http.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=1024))
        self.http.headers.update(auth_headers())
        self.model = _model_name(self.host, opts)
        self.context = max_model_len(self.host)
        self.current = None

    def _new_session(self):
        return self.workload.start_session(self.rng, self.scale, self.context)

    def _send(self, session, request) -> None:
        sample = Sample(kind=request.kind, start=time.time())
        try:
            sample = stream_request(self.http, self.host, request.path, request.body,
                                    kind=request.kind, model=self.model,
                                    ignore_eos=self.ignore_eos)
        except gevent.GreenletExit:
            sample.error = "unfinished at end of run"
            _write(sample.to_json())
            raise
        _write(sample.to_json())
        self.environment.events.request.fire(
            request_type="POST", name=request.kind, response_time=(sample.e2e or 0) * 1000,
            response_length=len(sample.text), context={},
            exception=None if sample.ok else RuntimeError(sample.error))
        session.record_response(sample.text, sample.prompt_tokens if sample.ok else None)

    def drive(self) -> None:
        """The user's task (subclasses override it: loadtests/trace.py)."""
        opts = self.environment.parsed_options
        if opts is not None and opts.arrival == "open":
            self._open_loop(opts)
        else:
            self._closed_loop_step()

    def _closed_loop_step(self) -> None:
        request = self.current.next_request() if self.current else None
        if request is None:
            self.current = self._new_session()
            request = self.current.next_request()
        self._send(self.current, request)

    def _open_loop(self, opts) -> None:
        """Poisson arrivals: exponential gaps on an absolute schedule (no drift)."""
        rate = opts.rate / max(1, opts.users_total or opts.num_users or 1)
        arrivals = OpenLoop(self.seed, self.user_id, rate)
        idle: list = []  # multi-turn sessions waiting, with their next request (park)
        next_t = time.monotonic()
        while True:
            next_t += arrivals.gap()
            gevent.sleep(max(0.0, next_t - time.monotonic()))
            picked = arrivals.pick(idle)
            if picked is None:
                session = self._new_session()
                picked = session, session.next_request()
            session, request = picked
            if len(_state["inflight"]) >= opts.max_inflight:
                _write(Sample(kind=request.kind, start=time.time(),
                              error="dropped: too many requests in flight").to_json())
                continue
            _state["inflight"].spawn(self._send_then_park, session, request, idle)

    def _send_then_park(self, session, request, idle: list) -> None:
        self._send(session, request)
        park(idle, session)
