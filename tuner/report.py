"""Results: the best-trials table, the spec.engine YAML patch, and the plots.

`python -m tuner report` rebuilds all three from storage alone (the sweep stores its
configuration on the study).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import jsonschema
import optuna
import yaml
from optuna.trial import TrialState

from tuner import study as st
from tuner.space import to_engine_spec

REPO_ROOT = Path(__file__).resolve().parent.parent
CRD_PATH = REPO_ROOT / "charts" / "paged-inference-operator" / "crds" / "pagedinferenceservices.yaml"

_COLUMNS = (("goodput", "goodput/s", 2), ("throughput", "req/s", 2), ("ttft_p99", "ttft p99", 3),
            ("tpot_p99", "tpot p99", 3), ("e2e_p99", "e2e p99", 2),
            ("prefix_cache_hit_rate", "hit rate", 2), ("kv_cache_usage_perc_max", "kv max", 2),
            ("server_preemptions", "preempt", 0))


def best_table(study: optuna.Study, *, top: int = 5) -> str:
    """A plain-text table of the best settings (mean over re-measurements)."""
    groups = st.grouped(study)[:top]
    if not groups:
        return "no feasible trial yet"
    names = list(groups[0]["params"])
    header = ["trials", *names, "n", *(label for _, label, _ in _COLUMNS)]
    rows = []
    for g in groups:
        row = [",".join(map(str, g["trials"]))]
        row += [_fmt(g["params"].get(n), 2) for n in names]
        row.append(str(g["measurements"]))
        row += [_fmt(g["figures"].get(key), digits) for key, _, digits in _COLUMNS]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    counts = {s: 0 for s in ("COMPLETE", "PRUNED", "FAIL")}
    infeasible = 0
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
        infeasible += "infeasible" in t.user_attrs
    summary = (f"{counts['COMPLETE'] - infeasible} complete, {counts['PRUNED']} pruned, "
               f"{infeasible} infeasible, {counts['FAIL']} failed")
    return "\n".join([*lines, summary])


def _fmt(value: Any, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def engine_patch(study: optuna.Study) -> dict | None:
    """{"spec": {"engine": {...}}} for the winner (fixed settings included), or None."""
    best = st.best_group(study)
    if best is None:
        return None
    fixed = study.user_attrs.get("config", {}).get("fixed", {})
    return {"spec": {"engine": to_engine_spec({**fixed, **best["params"]})}}


def patch_yaml(study: optuna.Study) -> str | None:
    patch = engine_patch(study)
    if patch is None:
        return None
    best = st.best_group(study)
    config = study.user_attrs.get("config", {})
    header = (f"# Best engine settings for workload {config.get('workload')!r} "
              f"(study {study.study_name!r}, trials {best['trials']}):\n"
              f"# goodput {best['goodput']:.3f} req/s over {best['measurements']} measurement(s)"
              f" under SLOs {config.get('slos')}.\n"
              "# A merge patch for a PagedInferenceService; apply with\n"
              "#   kubectl patch pis NAME --type merge --patch-file THIS_FILE\n")
    return header + yaml.safe_dump(patch, sort_keys=False)


def engine_schema(crd_path: Path = CRD_PATH) -> dict | None:
    """spec.engine's openAPIV3Schema from the CRD, or None when the CRD is absent."""
    if not crd_path.is_file():
        return None
    crd = next(d for d in yaml.safe_load_all(crd_path.read_text()) if d)
    return (crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            ["properties"]["spec"]["properties"]["engine"])


def validate_patch(patch: dict, *, crd_path: Path = CRD_PATH) -> bool:
    """Validate patch.spec.engine against the CRD; False when there is no CRD to check
    against, ValueError naming the field when it does not fit."""
    schema = engine_schema(crd_path)
    if schema is None:
        return False
    engine = patch["spec"]["engine"]
    # Kubernetes structural schemas are OpenAPI v3.0: draft-4 semantics (boolean
    # exclusiveMinimum); x-kubernetes-* keys are ignored by jsonschema.
    error = jsonschema.exceptions.best_match(jsonschema.Draft4Validator(schema).iter_errors(engine))
    if error is not None:
        where = ".".join(map(str, error.absolute_path)) or "engine"
        raise ValueError(f"spec.engine.{where}: {error.message}")
    # The CRD's CEL rule (x-kubernetes-validations), which jsonschema cannot run.
    if engine.get("maxNumBatchedTokens", 1 << 62) < engine.get("maxNumSeqs", 0):
        raise ValueError("spec.engine: maxNumBatchedTokens must be >= maxNumSeqs")
    return True


def save_plots(study: optuna.Study, out_dir: Path) -> list[Path]:
    """Optimisation history, parameter importance and a Pareto front (throughput vs the
    primary p99 latency) as PNG files; plots that need more trials are skipped."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    out_dir.mkdir(parents=True, exist_ok=True)
    primary = study.user_attrs.get("config", {}).get("primary_latency", "e2e")
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if st.feasible(t)]
    goodput = (lambda t: t.user_attrs.get("goodput", 0.0))
    saved = []
    plots = {"history": lambda: ovm.plot_optimization_history(
                 study, target=goodput, target_name="goodput (req/s)"),
             # PED-ANOVA ranks settings by how they reach LOW targets: negate goodput.
             "importance": lambda: ovm.plot_param_importances(
                 study, target=lambda t: -goodput(t), target_name="goodput"),
             "pareto": lambda: _pareto(plt, feasible, primary)}
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


def _pareto(plt, trials: list, primary: str):
    """Throughput (up) vs p99 latency (left); the non-dominated trials joined."""
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
    ax.scatter([p[0] for p in points], [p[1] for p in points], c="lightgray", label="trials")
    ax.plot([p[0] for p in front], [p[1] for p in front], "o-", c="tab:red", label="Pareto front")
    for lat, thr, n in front:
        ax.annotate(str(n), (lat, thr), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(f"{primary} p99 (s, client)")
    ax.set_ylabel("throughput (completed req/s)")
    ax.set_title("Pareto front: throughput vs tail latency")
    ax.legend()
    return ax
