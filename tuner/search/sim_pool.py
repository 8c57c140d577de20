"""The capacity sweep's simulated settings over several processes (`--sim-workers`).

One simulated capacity is one Python process stepping the engine's own scheduler: a
single core. A sweep's settings are independent, so `workers` processes simulate a
batch of them at once. The workers are forked from the sweep when the search starts and
inherit its simulator as it stands (the profile the pilot refitted, the prompts already
rendered, and the model's replies that speculative settings replay, which the search runs
before it forks when the space speculates): nothing is pickled but a setting and its
capacity. Each worker runs its torch with one thread (as a data
loader's workers do: the sampler's tensors are small, and threads would fight over the
cores the other workers use).

`workers` = 1 runs in the sweep's own process, as before. Fork is Linux's start method;
where the platform has none the search runs in-process.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

_PLAN = None   # what a forked worker inherits (set in the sweep before the fork):
_RUN = None    # the plan and simulate_point (tuner/search/capacity_search.py)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def default_workers() -> int:
    """One worker per usable CPU, at most 8."""
    return min(8, usable_cpus())


def _start_worker() -> None:
    import torch
    torch.set_num_threads(1)


def _simulate(settings: dict, start: float):
    return _RUN(_PLAN, settings, start=start)


class SimPool:
    """`map([(settings, start)])` -> [run(plan, settings, start=start)] in order, over
    `workers` processes (`run`: capacity_search.simulate_point)."""

    def __init__(self, plan, workers: int, run) -> None:
        if workers < 1:
            raise ValueError(f"--sim-workers must be >= 1, got {workers}")
        self.plan, self.run = plan, run
        self.workers = workers if "fork" in multiprocessing.get_all_start_methods() else 1
        self._executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> "SimPool":
        if self.workers > 1:
            global _PLAN, _RUN
            _PLAN, _RUN = self.plan, self.run
            # the tokenizer's own threads are not fork-safe; the workers render alone
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("fork"),
                initializer=_start_worker)
        return self

    def __exit__(self, *exc) -> None:
        global _PLAN, _RUN
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        _PLAN = _RUN = None

    def map(self, jobs: list[tuple[dict, float]]) -> list:
        if self._executor is None:
            return [self.run(self.plan, settings, start=start) for settings, start in jobs]
        futures = [self._executor.submit(_simulate, settings, start) for settings, start in jobs]
        return [f.result() for f in futures]
