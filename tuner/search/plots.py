"""The sweep's plots: goodput per trial, parameter importance, throughput vs tail latency.

Single search measurements are drawn light; the interleaved re-measurements of the
baseline and the candidates (tuner.search.confirm) are drawn as their means over the rounds,
with the gain interval's goodput range, so the eye lands on figures that survive noise.
"""
from __future__ import annotations

import statistics
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.search import study as st
from tuner.search.confirm import mean_figures


def save_plots(study: optuna.Study, out_dir: Path) -> list[Path]:
    """history.png, importance.png and pareto.png in out_dir; plots that need more
    trials are skipped."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    out_dir.mkdir(parents=True, exist_ok=True)
    primary = study.user_attrs.get("config", {}).get("primary_latency", "e2e")
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if st.feasible(t)]
    record = study.user_attrs.get("confirmation") or {}
    goodput = (lambda t: t.user_attrs.get("goodput", 0.0))
    saved = []
    plots = {"history": lambda: _mark_history(ovm.plot_optimization_history(
                 study, target=goodput, target_name="goodput (req/s)"), record),
             # PED-ANOVA ranks settings by how they reach LOW targets: negate goodput.
             "importance": lambda: ovm.plot_param_importances(
                 study, target=lambda t: -goodput(t), target_name="goodput"),
             "pareto": lambda: _pareto(plt, feasible, primary, record)}
    for name, draw in plots.items():
        if name == "importance" and len({tuple(sorted(t.params.items())) for t in feasible}) < 2:
            continue
        if not feasible:
            continue
        try:
            with warnings.catch_warnings():  # PED-ANOVA warns about any custom target
                warnings.simplefilter("ignore", UserWarning)
                axes = draw()
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            print(f"plot {name} skipped: {exc}")
            continue
        path = out_dir / f"{name}.png"
        axes.figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(axes.figure)
        saved.append(path)
    return saved


def _arm_means(record: dict):
    """(label, x trial or None, mean goodput, goodput range of its interval, figures)."""
    arms = record.get("arms", [])
    if not arms or not arms[0]["goodput"]:
        return []
    base = statistics.fmean(arms[0]["goodput"])
    out = []
    for a in arms:
        gain = (record.get("gains") or {}).get(a["label"])
        interval = (base * gain["low"], base * min(gain["high"], 1e6)) if gain else None
        out.append((a["label"], a["trials"][0] if a["trials"] else None,
                    statistics.fmean(a["goodput"]), interval, mean_figures(a)))
    return out


def _mark_history(ax, record: dict):
    """The baseline's re-measured mean as a line; each candidate's mean (with its gain
    interval in goodput) at its first search trial."""
    for label, x, mean, interval, _ in _arm_means(record):
        if x is None:
            ax.axhline(mean, color="black", linestyle="--", linewidth=1,
                       label=f"{label}: re-measured mean")
            continue
        err = ([[mean - interval[0]], [interval[1] - mean]] if interval else None)
        ax.errorbar([x], [mean], yerr=err, fmt="D", color="tab:green", capsize=4,
                    label=f"{label}: re-measured mean, 95% interval")
        ax.annotate(label, (x, mean), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.legend(fontsize=7)
    return ax


def _pareto(plt, trials: list, primary: str, record: dict):
    """Throughput (up) vs p99 latency (left): single search measurements light with
    their non-dominated ones joined; the re-measured means of the baseline and the
    candidates as labelled diamonds."""
    points = [(t.user_attrs.get(f"{primary}_p99"), t.user_attrs.get("throughput"), t.number)
              for t in trials]
    points = [p for p in points if p[0] is not None and p[1] is not None]
    if not points:
        raise ValueError(f"no trial has {primary}_p99")
    front, best = [], -1.0
    for lat, thr, n in sorted(points):
        if thr > best:
            front.append((lat, thr, n))
            best = thr
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([p[0] for p in points], [p[1] for p in points], c="lightgray",
               label="search trials (one measurement)")
    ax.plot([p[0] for p in front], [p[1] for p in front], "o--", c="tab:red", alpha=0.4,
            label="front of single measurements")
    for lat, thr, n in front:
        ax.annotate(str(n), (lat, thr), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for label, _, _, _, fig_ in _arm_means(record):
        lat, thr = fig_.get(f"{primary}_p99"), fig_.get("throughput")
        if lat is None or thr is None:
            continue
        ax.scatter([lat], [thr], marker="D", s=60, c="black" if label == "baseline" else "tab:green",
                   zorder=3)
        ax.annotate(f"{label} (mean)", (lat, thr), textcoords="offset points", xytext=(5, -10),
                    fontsize=8)
    ax.set_xlabel(f"{primary} p99 (s, client)")
    ax.set_ylabel("throughput (completed req/s)")
    ax.set_title("throughput vs tail latency (diamonds: re-measured means)")
    ax.legend(fontsize=7)
    return ax
