"""What the apply and capacity steps read of the Job's run (tuner/incluster/job.py's
`Tuning`), so that they need not import it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tuner.sources.workload_source import WorkloadSource
from tuner.incluster.cluster import Cluster
from paged_api.contract import TuningSpec
from tuner.measure.loadgen import LoadSpec
from tuner.measure.promql import PrometheusReader


class TuningRun(Protocol):
    cluster: Cluster
    spec: TuningSpec
    name: str                        # the PagedInferenceTuning's
    owner: dict                      # its owner reference, for the trial services
    target: dict                     # the target PagedInferenceService
    target_engine: dict              # the target's spec.engine when the Job started
    status: dict[str, Any]           # the tuning's status as this Job has written it
    load: LoadSpec
    slos: dict
    prometheus: PrometheusReader | None
    source: WorkloadSource
    out_dir: Path

    def publish(self, **fields: Any) -> None:
        """Write these fields into the tuning's status."""
