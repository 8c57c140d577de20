"""The TrialRunner of `python -m tuner sweep`: an engine process on this machine.

Each request starts `python -m engine serve` with the trial's settings as flags (the only
place they become flags) plus the flags every trial shares, measures it
(tuner/measure/trial.py) and stops it. Infeasible when the engine cannot start, fails its
warm-up, or dies during the load.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paged_api.settings import flags_for
from tuner.measure.engine_process import (DEFAULT_ENGINE_CMD, EngineProcess, EngineStartError,
                                          failure_reason)
from tuner.measure.loadgen import LoadSpec
from tuner.measure.promql import PrometheusReader, write_target
from tuner.measure.runner import Infeasible, TrialRequest
from tuner.measure.trial import engine_device, measure
from paged_api.search_space import engine_values


@dataclass(frozen=True)
class EngineLaunch:
    """How to start an engine: command, model and flags every trial shares."""

    model: str | None = None
    engine_cmd: str = DEFAULT_ENGINE_CMD
    extra_flags: tuple[str, ...] = ()
    startup_timeout: float = 300.0
    env: tuple[tuple[str, str], ...] = ()
    prometheus_targets_dir: Path | None = None  # file_sd folder a Prometheus watches

    def process(self, settings: dict[str, Any], log_path: Path) -> EngineProcess:
        # num_speculative_tokens 4 or suffix:8 -> --speculative-config with that method
        flags = flags_for(engine_values(settings))
        return EngineProcess(flags=[*flags, *self.extra_flags], model=self.model,
                             log_path=log_path, engine_cmd=self.engine_cmd, env=dict(self.env))


@dataclass(frozen=True)
class EngineRunner:
    """Measures each trial on a fresh engine process (see the module's doc)."""

    launch: EngineLaunch
    load: LoadSpec
    slos: dict
    warmup_requests: int = 2
    progress_interval: float = 2.0
    prometheus: PrometheusReader | None = None   # None: scrape the engine's /metrics

    def run(self, request: TrialRequest) -> dict[str, float]:
        launch = self.launch
        engine = launch.process(request.settings, request.workdir / "engine.log")
        try:
            try:
                engine.start(timeout=launch.startup_timeout)
            except EngineStartError as exc:
                raise Infeasible(exc.reason) from None
            if launch.prometheus_targets_dir is not None:
                write_target(launch.prometheus_targets_dir, f"tuner-{engine.port}", engine.url,
                             {"job": "paged-tuner", "trial": request.workdir.name})
            figures = measure(engine.url, dataclasses.replace(self.load, seed=request.seed),
                              self.slos, workdir=request.workdir,
                              warmup_requests=self.warmup_requests,
                              on_progress=request.on_progress,
                              progress_interval=self.progress_interval,
                              prometheus=self.prometheus)
            if not engine.alive():
                raise Infeasible("engine died during the load: "
                                 + failure_reason(engine.log_text(), engine.returncode))
            device = engine_device(engine.log_text())
            if device:
                figures["device"] = device
            return figures
        finally:
            if launch.prometheus_targets_dir is not None:
                write_target(launch.prometheus_targets_dir, f"tuner-{engine.port}", None)
            engine.stop()
