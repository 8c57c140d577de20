"""The capacity sweep's front-end time (tuner/search/capacity_sweep.py): what a request
spends outside the engine's steps (HTTP, tokenisation, streaming; tuner/sim/simulate.py),
measured on the pilot's engine under a light load and given to the simulator before the
search. `plan` is the sweep's CapacityPlan."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from tuner.measure.scoring import load_samples
from tuner.sim.simulate import front_seconds


def light_load(url: str, load, slos: dict, workdir: Path) -> list[dict]:
    """One light open-loop load on a running engine: its requests' records."""
    from tuner.measure.trial import measure

    measure(url, load, slos, workdir=workdir, warmup_requests=0)
    return load_samples(workdir / "samples.jsonl").records


def calibrate_front(plan, settings: dict, light: dict) -> None:
    """The simulator's time outside the engine's steps (HTTP, tokenisation, streaming;
    tuner/sim/simulate.py) from the pilot's light load: its median TTFT less that of the
    same settings (`settings`: the simulated engine's) simulated at that rate. Light, so
    that queueing (which the profile models, and may model wrongly) is not taken for
    front-end time."""
    records = light.get("records") or []
    if not any(r.get("ok") and r.get("ttft") is not None for r in records):
        plan.log("front-end time: none added (the pilot's light load recorded no TTFT"
                 + (f": {light['error']})" if light.get("error") else ")"))
        return
    simulated = dataclasses.replace(plan.sim, front_seconds=0.0).run(settings, light["rate"])
    try:
        front = front_seconds(records, simulated.samples.records)
    except ValueError as exc:
        plan.log(f"front-end time: none added ({exc})")
        return
    plan.sim = dataclasses.replace(plan.sim, front_seconds=front)
    plan.log(f"front-end time: {front * 1000:.1f} ms a request (the pilot's light load at "
             f"{light['rate']:.2f} req/s, real less simulated median TTFT)")
