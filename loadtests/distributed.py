"""Locust's distributed mode for the workloads: workers ship raw samples to the master.

Run as `locust -f loadtests/chat.py --master --expect-workers N --headless ...
--samples-file F` plus N × `locust -f loadtests/chat.py --worker --master-host H`
(`tuner.measure.loadgen` starts them; in a cluster, a master pod and N worker pods). The master's
custom options (seed, arrival, rate, ...) reach the workers with every spawn message.

- Workers never write a samples file: each sample line is buffered and sent to the master
  every FLUSH_INTERVAL seconds as a custom message (`runner.send_message(SAMPLES, ...)`).
- The master writes the start marker, every line it receives, and the stop marker: one
  merged samples file, read by the tuner exactly as a single process's.
- Stopping: a headless master's run-time limit fires its test_stop *before* it tells the
  workers (`quit`). So the master's test_stop broadcasts FLUSH; each worker stops its
  users (its in-flight requests are recorded as unfinished), sends its last lines and
  DONE, and the master waits for every worker's DONE (up to DONE_TIMEOUT s) before
  writing the stop marker, stamped with the time the stop began.
- Seeds: every worker numbers its users from `worker_index * USER_ID_STRIDE`, so no two
  workers replay the same request stream.
"""
from __future__ import annotations

import time
from typing import Callable

import gevent

SAMPLES = "paged_samples"
FLUSH = "paged_flush"
DONE = "paged_done"
FLUSH_INTERVAL = 0.5
DONE_TIMEOUT = 30.0
USER_ID_STRIDE = 1_000_000


def role(environment) -> str:
    """'master', 'worker' or 'local' (a single process)."""
    from locust.runners import MasterRunner, WorkerRunner

    runner = environment.runner
    if isinstance(runner, MasterRunner):
        return "master"
    if isinstance(runner, WorkerRunner):
        return "worker"
    return "local"


def worker_index(environment) -> int:
    """This worker's index (0..N-1, assigned by the master); 0 outside distributed mode."""
    return max(0, getattr(environment.runner, "worker_index", 0) or 0)


def worker_count(environment) -> int:
    """How many workers share the load (the master's --expect-workers; 1 when local)."""
    opts = environment.parsed_options
    if role(environment) == "local" or opts is None:
        return 1
    return max(1, getattr(opts, "expect_workers", 1) or 1)


class WorkerShipper:
    """A worker's sample sink: buffers lines, sends them to the master in batches."""

    def __init__(self, environment) -> None:
        self.runner = environment.runner
        self.index = worker_index(environment)
        self._lines: list[str] = []
        self._loop = gevent.spawn(self._flush_forever)

    def write(self, line: str) -> None:
        self._lines.append(line)

    def flush(self) -> None:
        lines, self._lines = self._lines, []
        if lines:
            self.runner.send_message(SAMPLES, {"worker": self.index, "lines": lines})

    def _flush_forever(self) -> None:
        while True:
            gevent.sleep(FLUSH_INTERVAL)
            self.flush()

    def close(self) -> None:
        self._loop.kill()
        self.flush()


def install_worker(environment) -> None:
    """On FLUSH from the master: stop, which fires test_stop (in-flight requests are
    recorded, the shipper sends its last lines: loadtests/common.py), then say DONE."""
    def handle(environment, msg, **_) -> None:
        environment.runner.stop()
        environment.runner.send_message(DONE, {"worker": worker_index(environment)})

    environment.runner.register_message(FLUSH, handle)


class MasterCollector:
    """The master's side: writes workers' lines and waits for their DONE at the stop."""

    def __init__(self, environment, write: Callable[[str], None]) -> None:
        self.environment = environment
        self.write = write
        self.received = 0
        self.done: set[int] = set()
        runner = environment.runner
        runner.register_message(SAMPLES, self._on_samples)
        runner.register_message(DONE, lambda environment, msg, **_: self.done.add(
            msg.data["worker"]))

    def _on_samples(self, environment, msg, **_) -> None:
        for line in msg.data["lines"]:
            self.write(line)
            self.received += 1

    def drain(self) -> float:
        """Ask every worker to stop and flush; wait for them. Returns the stop time."""
        stopped_at = time.time()
        runner = self.environment.runner
        expected = len(runner.clients)
        runner.send_message(FLUSH)
        deadline = time.monotonic() + DONE_TIMEOUT
        while len(self.done) < expected and time.monotonic() < deadline:
            gevent.sleep(0.05)
        if len(self.done) < expected:
            import logging
            logging.getLogger("loadtests").error(
                "only %d of %d workers flushed their samples within %.0f s",
                len(self.done), expected, DONE_TIMEOUT)
        return stopped_at
