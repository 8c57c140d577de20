"""Where a sweep's load comes from: a synthetic workload, a trace, or Prometheus.

`--workload NAME` (loadtests/workloads), `--trace FILE` (replayed at its arrival times,
loadtests/workloads/trace.py) or `--workload-from-prometheus URL --window 24h` (lengths and
rate fitted from the service's histograms, tuner/sources/histogram.py, written as a
trace of `--duration` seconds and replayed). The last two come with a workload document,
what was inferred and what was assumed, printed and written to <out-dir>/workload.md.
These are the functions the in-cluster tuning (spec.workloadFrom) calls too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from loadtests.workloads import TRACE_WORKLOAD, WorkloadSpec, get_workload
from loadtests.workloads.trace import read_trace, trace_rate, write_trace
from tuner.sources.histogram import fit_from_prometheus
from tuner.measure.loadgen import LoadSpec
from tuner.measure.promql import PrometheusReader
from tuner.sources.log_to_trace import describe_trace, render_document


@dataclass(frozen=True)
class WorkloadSource:
    name: str                      # the LoadSpec workload ("trace" for both non-synthetic)
    spec: WorkloadSpec
    trace: Path | None = None      # the trace file replayed (None: synthetic)
    trace_rate: float | None = None  # its own mean arrival rate, req/s
    document: str | None = None    # inferred / assumed, for workload.md

    def load(self, load: LoadSpec) -> LoadSpec:
        """`load` adapted to this source: a trace replays open loop, --rate rescales it."""
        if self.trace is None:
            return load
        speed = load.rate / self.trace_rate if load.arrival == "open" else 1.0
        return dataclasses.replace(load, workload=TRACE_WORKLOAD, trace=str(self.trace),
                                   trace_speed=speed, arrival="open", users=1)

    def write_document(self, out_dir: Path) -> Path | None:
        if self.document is None:
            return None
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "workload.md"
        path.write_text(self.document)
        return path


def from_trace(path: str | Path) -> WorkloadSource:
    trace = read_trace(path)
    doc = describe_trace(trace, source=f"trace {path}")
    return WorkloadSource(name=TRACE_WORKLOAD, spec=get_workload(TRACE_WORKLOAD),
                          trace=Path(path).resolve(), trace_rate=trace_rate(trace),
                          document=render_document(doc))


def from_prometheus(url: str, *, window: str, selector: str, duration: float, seed: int,
                    out_dir: Path) -> WorkloadSource:
    """Fit, then write the synthetic trace (`duration` s) to out_dir/workload-trace.jsonl."""
    fitted = fit_from_prometheus(PrometheusReader(url), selector=selector, window=window)
    trace = fitted.synthesize(duration, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "workload-trace.jsonl"
    write_trace(path, trace)
    return WorkloadSource(name=TRACE_WORKLOAD, spec=get_workload(TRACE_WORKLOAD),
                          trace=path.resolve(), trace_rate=fitted.rate,
                          document=render_document(fitted.document()))


def resolve(args, *, out_dir: Path) -> WorkloadSource:
    """The source the sweep's flags name; ValueError naming the flags to fix."""
    given = [flag for flag, value in (("--workload", args.workload), ("--trace", args.trace),
             ("--workload-from-prometheus", args.workload_from_prometheus)) if value]
    if len(given) != 1:
        raise ValueError("give exactly one of --workload, --trace, --workload-from-prometheus"
                         + (f" (got {', '.join(given)})" if given else ""))
    if args.trace:
        return from_trace(args.trace)
    if args.workload_from_prometheus:
        return from_prometheus(args.workload_from_prometheus, window=args.window,
                               selector=args.workload_selector, duration=args.duration,
                               seed=args.seed, out_dir=out_dir)
    return WorkloadSource(name=args.workload, spec=get_workload(args.workload))
