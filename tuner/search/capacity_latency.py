"""Real against simulated latency distributions of the confirmed arms (latency.png).

For each arm, the last round's highest passing real probe (its samples.jsonl) and the
simulator run at that probe's rate with the arm's settings: TTFT and inter-token gaps at
QUANTILES. What the capacity table cannot show: whether the simulator is right about the
shape (the queueing tail, the decode gaps) or only about the knee.

The twin is the real probe's: the warm-up served, what it left running dropped, then a
window from an empty queue (a real probe waits until the previous load drained). Run
straight on from its warm-up instead, a twin at a rate above the simulated capacity inherits
the warm-up's backlog (200 requests by default): below about 3/4 of the rate, no request of
a 64-arrival window finishes and the simulated side has no TTFT at all (CI, 2026-12-06).
"""
from __future__ import annotations

from pathlib import Path

from tuner.measure.scoring import load_samples

QUANTILES = tuple(q / 20 for q in range(1, 20))   # 5 % .. 95 %
SIM_REQUESTS = 64   # the simulated twin's window holds this many arrivals at least


def _quantiles(values: list[float]) -> list[float] | None:
    values = sorted(values)
    if not values:
        return None
    return [values[min(len(values) - 1, int(q * len(values)))] for q in QUANTILES]


def distributions(records: list[dict]) -> dict:
    return {"ttft": _quantiles([r["ttft"] for r in records if r.get("ttft") is not None]),
            "itl": _quantiles([g for r in records for g in (r.get("itl") or [])])}


def twin(sim, base: dict):
    """The sweep's `run` for latency_comparison: the SimContext `sim` with its fixed
    settings `base` under each arm's (less what the simulator does not model), for at
    least the context's window, from an empty queue."""
    return lambda settings, rate, duration: sim.run(
        {**base, **settings}, rate, duration=max(sim.duration, duration),
        fresh=True)


def compare_arm(run, settings: dict, workdir: Path, probes: list[dict]) -> dict | None:
    """`run(settings, rate, duration)`: the simulator (SimContext.run) for at least
    `duration` virtual s, which at the rate brings SIM_REQUESTS arrivals: a short window at
    a low rate (a one-sequence baseline's knee) can hold none. None when no real probe
    passed or its samples are gone."""
    passed = [(i, p) for i, p in enumerate(probes) if p["passed"]]
    if not passed:
        return None
    i, probe = max(passed, key=lambda ip: ip[1]["rate"])
    path = workdir / f"probe-{i:02d}" / "samples.jsonl"
    if not path.exists():
        return None
    real = load_samples(path).records
    sim = run(settings, probe["rate"], SIM_REQUESTS / probe["rate"]).samples.records
    return {"rate": probe["rate"], "quantiles": list(QUANTILES),
            "real": distributions(real), "sim": distributions(sim)}


def latency_comparison(run, round_dir: Path, arms: list[dict], last: int) -> dict:
    """Each arm's round `last` (its probes under round_dir/<label>): `run(settings, rate,
    duration)` simulates the arm's settings."""
    return {arm["label"]: compare_arm(
        run, arm["settings"], round_dir / arm["label"],
        arm["probes"][last] if len(arm["probes"]) > last else []) for arm in arms}


def save_plot(latency: dict, out_dir: Path) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [(label, c) for label, c in latency.items() if c]
    if not arms:
        return None
    fig, axes = plt.subplots(len(arms), 2, figsize=(7, 2.6 * len(arms)), squeeze=False)
    for row, (label, c) in zip(axes, arms):
        for ax, name in zip(row, ("ttft", "itl")):
            for kind, style in (("real", "-"), ("sim", "--")):
                if c[kind][name]:
                    ax.plot(c[kind][name], c["quantiles"], style,
                            label=f"{kind} at {c['rate']:.1f} req/s")
            ax.set_xlabel(f"{name} (s)")
            ax.set_ylabel(f"{label}: share")
            ax.legend(fontsize=7)
    path = out_dir / "latency.png"
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
