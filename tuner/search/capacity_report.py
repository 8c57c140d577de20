"""What a capacity sweep prints and writes: the simulated top settings, the real
confirmation, the result line (defaults, tuned, gain with its interval, replicas for the
target rate), the winner's spec patch, capacity.json and capacity-vs-setting plots."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

from paged_api.search_space import to_spec_patch
from tuner.search.capacity_sweep import drift_text, replicas


def _fmt(params: dict) -> str:
    return " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in params.items()) or "(engine defaults)"


def simulated_table(record: dict, *, top: int = 5) -> str:
    done = [p for p in record["simulated"] if p["capacity"] is not None]
    unique = {json.dumps(p["params"], sort_keys=True): p for p in done}.values()
    rows = sorted(unique, key=lambda p: p["capacity"], reverse=True)[:top]
    lines = [f"  {'rank':>4}  {'req/s':>7}  settings",
             f"  {'base':>4}  {record['sim_baseline']:>7.2f}  baseline"]
    lines += [f"  {i:>4}  {p['capacity']:>7.2f}  {_fmt(p['params'])}"
              for i, p in enumerate(rows, start=1)]
    return "\n".join(lines)


def confirmation_table(record: dict) -> str | None:
    if not record.get("rounds"):
        return None
    lines = [f"  {'arm':>8}  {'simulated':>9}  {'real per round (req/s)':<28}  {'median':>7}  "
             f"{'steps priced':>12}  gain"]
    for arm in record["arms"]:
        rounds = ", ".join(f"{c:.2f}" for c in arm["capacity"])
        gain = arm.get("gain")
        text = (f"{gain['ratio']:.2f}x [{gain['low']:.2f}, {gain['high']:.2f}]" if gain
                else ("-" if arm["label"] == "baseline" else "failed in a round"))
        priced = [p for p in arm.get("step_price", []) if p is not None]
        price = f"{statistics.median(priced):.2f}" if priced else "-"
        lines.append(f"  {arm['label']:>8}  {arm['sim']:>9.2f}  {rounds:<28}  "
                     f"{statistics.median(arm['capacity']):>7.2f}  {price:>12}  {text}")
    if any(p is not None for arm in record["arms"] for p in arm.get("step_price", [])):
        lines.append("  (steps priced: what the simulator's profile charges for the steps "
                     "each arm's engines served, over what they took; median of rounds)")
    pilot, drift = record.get("pilot"), record.get("pilot_drift")
    if pilot:
        lines.append("  (before the rounds, not scored: the baseline's pilot "
                     + (f"{pilot['capacity']:.2f} req/s" if not pilot["failed"]
                        else f"failed: {pilot['failed']}")
                     + (f", {drift['ratio']:.2f}x its rounds' median)" if drift else ")"))
    if drift and drift["flagged"]:
        lines.append(f"  warning: {drift_text(drift)}")
    return "\n".join(lines)


def result_lines(record: dict) -> list[str]:
    """Defaults, tuned, the gain with its interval and the replicas for the target rate."""
    arms = {a["label"]: a for a in record["arms"]}
    base = arms["baseline"]
    real = bool(record.get("rounds"))
    figure = (lambda a: statistics.median(a["capacity"])) if real else (lambda a: a["sim"])
    kind = "real, median of rounds" if real else "simulated"
    if not real and base.get("capacity"):   # no rounds, but the pilot measured it
        figure, kind = (lambda a: statistics.median(a["capacity"])), \
            f"real, the pilot; simulated {base['sim']:.2f}"
    lines = [f"baseline: {figure(base):.2f} req/s per replica ({kind})"]
    winner = arms.get(record.get("winner") or "")
    if winner is not None:
        g = winner["gain"]
        lines.append(f"tuned ({winner['label']}: {_fmt(winner['params'])}): "
                     f"{figure(winner):.2f} req/s per replica; capacity gain "
                     f"{g['ratio']:.2f}x [{g['low']:.2f}, {g['high']:.2f}] (95% interval)")
    else:
        lines.append(f"keep the baseline: {record['reason']}")
    target = record.get("target_rate")
    if target:
        keep = replicas(target, figure(base))
        lines.append(f"replicas for {target:g} req/s: {keep if keep else 'none meets the SLOs'}"
                     f" with the baseline" + (f", {replicas(target, figure(winner))} tuned"
                                               if winner is not None else ""))
    return lines


def _anchor(profile: dict) -> str:
    anchor = profile.get("anchor")
    if not anchor or anchor["factor"] == 1.0:
        return ""
    return f"; step times x {anchor['factor']:.3g} to meet the pilot's {anchor['pilot']:.2f} req/s"


def print_and_write(record: dict, *, out: Path, out_dir: Path) -> int:
    print(f"\nsimulated capacity (req/s per replica at >= {record['attainment']:.0%} SLO "
          f"attainment; {len(record['simulated'])} settings in {record['sim_wall_s']:.0f} s; "
          f"profile {record['profile']['form']}, held-out error "
          f"{record['profile']['heldout_error']:.1%}{_anchor(record['profile'])}):")
    print(simulated_table(record))
    table = confirmation_table(record)
    if table:
        print(f"\nconfirmed for real ({record['rounds']} interleaved rounds, one engine per arm "
              "and round; gain = paired capacity ratio, 95% t-interval):")
        print(table)
    print("\nresult:")
    for line in result_lines(record):
        print(f"  {line}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "capacity.json").write_text(json.dumps(record, indent=2, default=str))
    winner = {a["label"]: a for a in record["arms"]}.get(record.get("winner") or "")
    if winner is not None:
        from tuner.search.report import validate_patch
        patch = {"spec": to_spec_patch(winner["params"])}
        try:
            validated = validate_patch(patch)
        except ValueError as exc:
            print(f"the tuned settings do not fit the PagedInferenceService CRD: {exc}",
                  file=sys.stderr)
            return 1
        text = yaml.safe_dump(patch, sort_keys=False)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"\n{text}written to {out}" + ("" if validated else " (no CRD to validate)"))
    for path in save_plots(record, out_dir):
        print(f"plot: {path}")
    return 0


def _axis(ax, values: list):
    """x positions for a setting's values: the values themselves when all are numbers,
    else one tick per distinct value (numbers first, in order), labelled with it
    (num_speculative_tokens mixes 0, 2, 4 with "suffix:8")."""
    def numeric(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if all(numeric(v) for v in values):
        return lambda v: v
    ticks = sorted(set(values), key=lambda v: (not numeric(v), v if numeric(v) else 0, str(v)))
    ax.set_xticks(range(len(ticks)), [str(v) for v in ticks], rotation=45, fontsize=7)
    return {v: i for i, v in enumerate(ticks)}.__getitem__


def save_plots(record: dict, out_dir: Path) -> list[Path]:
    """capacity.png: simulated capacity against each searched setting, the confirmed arms'
    real medians drawn over them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in record["simulated"] if p["capacity"] is not None]
    names = sorted({n for p in points for n in p["params"]})
    if not points or not names:
        return []
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.0), squeeze=False)
    for ax, name in zip(axes[0], names):
        values = [p["params"][name] for p in points if name in p["params"]]
        ys = [p["capacity"] for p in points if name in p["params"]]
        arms = [(arm, arm["params"].get(name)) for arm in record["arms"]
                if arm.get("capacity") and arm["params"].get(name) is not None]
        place = _axis(ax, values + [x for _, x in arms])
        ax.scatter([place(x) for x in values], ys, s=12, alpha=0.5, label="simulated")
        for arm, x in arms:
            ax.scatter([place(x)], [statistics.median(arm["capacity"])], marker="*", s=90,
                       label=f"{arm['label']} (real)")
        ax.set_xlabel(name)
        ax.set_ylabel("capacity (req/s)")
    axes[0][0].legend(fontsize=7)
    path = out_dir / "capacity.png"
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    from tuner.search.capacity_latency import save_plot
    latency = save_plot(record.get("latency") or {}, out_dir)
    return [path] + ([latency] if latency else [])
