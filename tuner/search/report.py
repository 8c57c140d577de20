"""Results: what they hold for, the search and confirmation tables, the spec.engine
YAML patch (plots: tuner.search.plots).

`python -m tuner report` rebuilds all of it from storage alone (the sweep stores its
configuration and the confirmation on the study).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import jsonschema
import optuna
import yaml

from tuner.search import study as st
from tuner.search.confirm import mean_figures
from paged_api.search_space import to_spec_patch

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = REPO_ROOT / "charts" / "paged-inference-operator" / "crds" / "pagedinferenceservices.yaml"

# spec_acceptance_rate: accepted / draft tokens of speculative decoding ("-": no drafts)
_COLUMNS = (("goodput", "goodput/s", 2), ("spec_acceptance_rate", "accept", 2),
            ("throughput", "req/s", 2), ("ttft_p99", "ttft p99", 3),
            ("tpot_p99", "tpot p99", 3), ("e2e_p99", "e2e p99", 2),
            ("prefix_cache_hit_rate", "hit rate", 2), ("kv_cache_usage_perc_max", "kv max", 2),
            ("server_preemptions", "preempt", 0))


def best_table(study: optuna.Study, *, top: int = 5) -> str:
    """A plain-text table of the search's best settings (one measurement each, unless
    the sampler proposed the same settings again)."""
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


def context(study: optuna.Study) -> str:
    """One line: the workload, load, SLOs, model and device the results hold for."""
    c = study.user_attrs.get("config", {})
    load = (f"open loop at {c.get('rate')} req/s" if c.get("arrival") == "open"
            else f"{c.get('users')} users (closed loop)")
    slos = "; ".join(f"{kind} " + ", ".join(f"{n}<={v:g}s" for n, v in slo.items())
                     for kind, slo in (c.get("slos") or {}).items())
    devices = {t.user_attrs["device"] for t in study.get_trials(deepcopy=False)
               if "device" in t.user_attrs}
    arms = (study.user_attrs.get("confirmation") or {}).get("arms", [])
    devices |= {f["device"] for a in arms for f in a["figures"] if "device" in f}
    flags = " ".join(c.get("engine_flags") or []) or "none"
    return (f"workload {c.get('workload')}, {load}, {c.get('duration')} s per measurement, "
            f"length scale {c.get('length_scale', 1)}; SLOs {slos}; model "
            f"{c.get('model') or 'embedded tiny model'}; device "
            f"{', '.join(sorted(devices)) or 'unknown'}; extra engine flags {flags}; "
            f"server figures from {c.get('metrics_source', '/metrics')}")


def confirmation_table(study: optuna.Study) -> str | None:
    """Baseline and candidates over the interleaved rounds, with gains and the decision."""
    record = study.user_attrs.get("confirmation")
    if not record or "decision" not in record:
        return None
    gains = record["gains"]
    header = ["arm", "search trials", "settings", "rounds", "goodput/s (mean±sd)",
              "gain [95% CI]", "accept", "ttft p99", "e2e p99", "failed"]
    rows = []
    for a in record["arms"]:
        g, fig = gains.get(a["label"]), mean_figures(a)
        values = a["goodput"]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        gain = ("1 (reference)" if a["label"] == "baseline" else
                "-" if g is None else f"{g['ratio']:.2f} [{g['low']:.2f}, {g['high']:.2f}]")
        rows.append([a["label"], ",".join(map(str, a["trials"])) or a["source"],
                     " ".join(f"{k}={v}" for k, v in a["params"].items()), str(len(values)),
                     f"{statistics.fmean(values):.2f}±{sd:.2f}", gain,
                     _fmt(fig.get("spec_acceptance_rate"), 2),
                     _fmt(fig.get("ttft_p99"), 3), _fmt(fig.get("e2e_p99"), 2),
                     str(sum(1 for f in a["failed"] if f))])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join([*lines, "decision: " + record["decision"]["reason"]])


def summary(study: optuna.Study) -> dict | None:
    """The result in a few figures: baseline and winner goodput, gain and interval, the
    settings to apply and why; None before any confirmation or feasible trial."""
    record = study.user_attrs.get("confirmation")
    if record and "decision" in record:
        arms = {a["label"]: a for a in record["arms"]}
        winner = record["decision"]["winner"]
        arm = arms[winner or "baseline"]
        return {"confirmed": True, "label": winner or "baseline", "params": arm["params"],
                "baseline_goodput": statistics.fmean(arms["baseline"]["goodput"]),
                "goodput": statistics.fmean(arm["goodput"]), "rounds": len(arm["goodput"]),
                "gain": record["gains"].get(winner) if winner else None,
                "baseline_source": arms["baseline"]["source"],
                "reason": record["decision"]["reason"], "trials": arm["trials"]}
    best = st.best_group(study)
    if best is None:
        return None
    fixed = study.user_attrs.get("config", {}).get("fixed", {})
    return {"confirmed": False, "label": "search best", "params": {**fixed, **best["params"]},
            "baseline_goodput": None, "goodput": best["goodput"],
            "rounds": best["measurements"], "gain": None, "baseline_source": None,
            "reason": "not confirmed against a baseline (--remeasure 0 or --confirm-rounds 0)",
            "trials": best["trials"]}


def result_line(study: optuna.Study) -> str:
    s = summary(study)
    if s is None:
        return "no feasible trial"
    if not s["confirmed"]:
        return f"search best {s['goodput']:.2f} req/s (trials {s['trials']}): {s['reason']}"
    base = f"baseline ({s['baseline_source']}) {s['baseline_goodput']:.2f} req/s"
    if s["gain"] is None:
        return f"{base}; {s['reason']}: keeping the baseline"
    g = s["gain"]
    return (f"{base}; winner {s['label']} (trials {s['trials']}) {s['goodput']:.2f} req/s; "
            f"gain {g['ratio']:.2f}x, 95% interval [{g['low']:.2f}, {g['high']:.2f}] "
            f"over {s['rounds']} interleaved rounds")


def engine_patch(study: optuna.Study) -> dict | None:
    """{"spec": {"engine": {...}}} (and {"kvCache": {"offloadGiB": ...}} when the host tier
    was searched): the confirmed winner, else the baseline when nothing beat it, else
    (unconfirmed) the search's best; None without a feasible trial."""
    s = summary(study)
    return None if s is None else {"spec": to_spec_patch(s["params"])}


def patch_yaml(study: optuna.Study) -> str | None:
    patch = engine_patch(study)
    if patch is None:
        return None
    s = summary(study)
    what = ("baseline settings kept" if s["confirmed"] and s["gain"] is None
            else "best engine settings" if s["confirmed"] else "unconfirmed best settings")
    header = (f"# {what[0].upper() + what[1:]} (study {study.study_name!r}).\n"
              + "".join(f"# {line}\n" for line in _wrap(context(study)))
              + "".join(f"# {line}\n" for line in _wrap(result_line(study)))
              + "# A merge patch for a PagedInferenceService; apply with\n"
              "#   kubectl patch pis NAME --type merge --patch-file THIS_FILE\n")
    return header + yaml.safe_dump(patch, sort_keys=False)


def _wrap(text: str, width: int = 96) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width)


def engine_schema(crd_path: Path = CRD_PATH, section: str = "engine") -> dict | None:
    """spec.<section>'s openAPIV3Schema from the CRD, or None when the CRD is absent."""
    if not crd_path.is_file():
        return None
    crd = next(d for d in yaml.safe_load_all(crd_path.read_text()) if d)
    return (crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            ["properties"]["spec"]["properties"][section])


def _without_nulls(value: dict) -> dict:
    return {k: _without_nulls(v) if isinstance(v, dict) else v for k, v in value.items()
            if v is not None}


def validate_patch(patch: dict, *, crd_path: Path = CRD_PATH) -> bool:
    """Validate patch.spec's sections (engine; kvCache when the host tier was searched)
    against the CRD; False when there is no CRD to check against, ValueError naming the
    field when it does not fit."""
    if engine_schema(crd_path) is None:
        return False
    for section, value in patch["spec"].items():
        value = _without_nulls(value)  # null: remove (a method's keys too, nested)
        # Kubernetes structural schemas are OpenAPI v3.0: draft-4 semantics (boolean
        # exclusiveMinimum); x-kubernetes-* keys are ignored by jsonschema.
        error = jsonschema.exceptions.best_match(jsonschema.Draft4Validator(
            engine_schema(crd_path, section)).iter_errors(value))
        if error is not None:
            where = ".".join(map(str, error.absolute_path)) or section
            raise ValueError(f"spec.{section}.{where}: {error.message}")
    engine = {k: v for k, v in patch["spec"]["engine"].items() if v is not None}
    # The CRD's CEL rule (x-kubernetes-validations), which jsonschema cannot run.
    if engine.get("maxNumBatchedTokens", 1 << 62) < engine.get("maxNumSeqs", 0):
        raise ValueError("spec.engine: maxNumBatchedTokens must be >= maxNumSeqs")
    return True


