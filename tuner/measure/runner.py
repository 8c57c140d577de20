"""The whole contract between the search and whatever measures a trial.

The search loop (tuner/search/loop.py) and the confirmation (tuner/search/confirm.py) hand a
`TrialRunner` one `TrialRequest` at a time and get the trial's figures back. Two runners
exist:

- `tuner.measure.local.EngineRunner`: an engine process on this machine (`python -m tuner
  sweep`); the settings become command-line flags where the process starts;
- `tuner.incluster.service_runner.ServiceRunner`: a trial PagedInferenceService in a
  cluster (the PagedInferenceTuning Job); the settings become `spec.engine` where the
  resource is written.

Settings travel as a dict keyed by the names of api/paged_api/settings.py (`block_size`,
`max_num_seqs`, ...), never as flags or CRD fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

# (elapsed seconds, goodput so far in req/s) -> True to stop the measurement early
Progress = Callable[[float, float], bool]


class Infeasible(RuntimeError):
    """These settings cannot serve: the engine did not start, ran out of memory, died, or
    refused the load. A result of the search (scored as such), not a harness failure."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TrialRequest:
    name: str                       # unique per measurement: `trial-0003`, `round-1-C1`
    settings: dict[str, Any]        # engine settings by api/paged_api/settings.py name
    seed: int                       # the load's seed: equal seeds replay one request stream
    workdir: Path                   # the measurement's raw samples and logs
    on_progress: Progress | None = field(default=None, compare=False)


class TrialRunner(Protocol):
    """Measures one trial. Returns its figures (all floats: goodput, throughput, latency
    quantiles, server figures; tuner/measure/trial.py lists them). Raises Infeasible for
    settings that cannot serve, tuner.measure.loadgen.LoadError when the harness itself
    failed (the trial fails, the search goes on)."""

    def run(self, request: TrialRequest) -> dict[str, float]: ...
