"""After the search: the baseline and the best K candidates re-measured interleaved.

Round r measures every arm once, in a rotated order (round 0: B C1 C2, round 1: C1 C2 B,
round 2: C2 B C1, ...), each with a fresh engine process and a fresh load window; all
arms of a round replay the same request stream (seed --seed + 1 + r, never the search's
--seed), so the rounds pair. Search measurements are not reused: the candidates were
picked *because* they measured well once (the winner's curse). Gains, intervals and the
decision come from tuner.search.stats. Everything is kept on the study as the user attribute
`confirmation` after every round, so an interrupted confirmation resumes, a larger
--confirm-rounds extends it, and `python -m tuner report` rebuilds the result.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna
import yaml

from tuner.measure.runner import Infeasible, TrialRequest, TrialRunner
from tuner.search import study as st
from paged_api.search_space import SETTINGS, default_value, from_engine_spec, from_spec_sections
from tuner.search.stats import decide, paired_gain

BASELINE = "baseline"


@dataclass(frozen=True)
class Baseline:
    """The current settings: `params` describe them (defaults included), `settings` are
    what a runner starts the engine with (unset ones keep the engine's defaults)."""

    params: dict
    settings: dict
    source: str   # "engine defaults" or the --baseline file


def engine_defaults(names) -> dict:
    """The engine's own defaults (the settings table's) for these settings; unset ones
    left out."""
    return {n: default_value(n) for n in names if default_value(n) is not None}


def load_baseline(path: str | None, *, fixed: dict, searched: list[str]) -> Baseline:
    """The engine defaults (plus --set), or a YAML file holding a spec.engine fragment:
    `spec: {engine: {...}}`, `engine: {...}` or the bare mapping; a `spec.kvCache.offloadGiB`
    beside it (a sweep's own patch) is the baseline's host KV tier. ValueError names the
    problem."""
    if path is None:
        return Baseline({**engine_defaults(searched), **fixed}, dict(fixed), "engine defaults")
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"--baseline {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--baseline {path}: not YAML ({exc})") from None
    outside: dict = {}
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        doc = doc["spec"]
        outside = from_spec_sections(doc, where=f"--baseline {path}: spec")
    if isinstance(doc, dict) and isinstance(doc.get("engine"), dict):
        doc = doc["engine"]
    if not isinstance(doc, dict) or not (doc or outside):
        raise ValueError(f"--baseline {path}: expected a spec.engine mapping such as "
                         "'spec: {engine: {maxNumSeqs: 16}}'")
    params = {**fixed, **from_engine_spec(doc, where=f"--baseline {path}"), **outside}
    return Baseline(params, dict(params), str(path))


def candidates(study: optuna.Study, k: int, baseline: Baseline) -> list[dict]:
    """The best k settings of the search (Pareto-optimal first in pareto mode), minus
    any that equal the baseline."""
    groups = st.ranked_groups(study)
    same = {n: v for n, v in baseline.params.items() if n in SETTINGS}
    return [g for g in groups if {**same, **g["params"]} != same][:k]


def _arm(label: str, params: dict, settings: dict, trials: list[int],
         source: str = "search") -> dict:
    return {"label": label, "params": params, "settings": settings, "trials": trials,
            "source": source, "goodput": [], "failed": [], "figures": []}


def run_confirmation(study: optuna.Study, *, baseline: Baseline, k: int, rounds: int,
                     seed: int, floor: float, out_dir: Path, fixed: dict,
                     runner: TrialRunner,
                     log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                     min_gain: float = 1.0) -> dict:
    """Measure baseline and candidates `rounds` times interleaved; store and return the
    confirmation record. Each measurement is one `runner` request named
    `round-R-LABEL` (tuner/measure/runner.py)."""
    arms = [_arm(BASELINE, baseline.params, baseline.settings, [], baseline.source)]
    for i, g in enumerate(candidates(study, k, baseline), start=1):
        settings = {**fixed, **g["params"]}
        arms.append(_arm(f"C{i}", settings, settings, g["trials"]))
    record = study.user_attrs.get("confirmation")
    if not (record and [(a["label"], a["params"], a.get("settings")) for a in record["arms"]]
            == [(a["label"], a["params"], a["settings"]) for a in arms]):
        record = {"arms": arms}  # new, or the candidates changed: start over
    arms = record["arms"]
    done = min(len(a["goodput"]) for a in arms)
    for a in arms:  # a round interrupted half-way is measured again whole
        for key in ("goodput", "failed", "figures"):
            del a[key][done:]
    if len(arms) > 1:
        log(f"confirming {len(arms) - 1} candidate(s) against the baseline "
            f"({baseline.source}): rounds {done + 1}..{rounds}, interleaved")
    for r in range(done, rounds if len(arms) > 1 else 0):
        for a in arms[r % len(arms):] + arms[:r % len(arms)]:
            request = TrialRequest(name=f"round-{r}-{a['label']}", settings=a["settings"],
                                   seed=seed + 1 + r,
                                   workdir=out_dir / "confirm" / f"round-{r}" / a["label"])
            try:
                figures = runner.run(request)
                a["failed"].append(None)
            except Infeasible as exc:
                figures = {"goodput": 0.0}
                a["failed"].append(exc.reason)
            a["goodput"].append(figures["goodput"])
            a["figures"].append({k: v for k, v in figures.items()
                                 if isinstance(v, (int, float, str))})
            log(f"round {r + 1}/{rounds} {a['label']:>8}: goodput {figures['goodput']:.2f} "
                f"req/s" + (f" (failed: {a['failed'][-1]})" if a["failed"][-1] else ""))
        study.set_user_attr("confirmation", {**record, "rounds": r + 1})
    record = summarize({**record, "rounds": min(len(a["goodput"]) for a in arms)},
                       floor=floor, min_gain=min_gain)
    study.set_user_attr("confirmation", record)
    return record


def summarize(record: dict, *, floor: float, min_gain: float = 1.0) -> dict:
    """Add gains (None for a candidate that failed in any round) and the decision."""
    base = record["arms"][0]
    gains = {}
    for a in record["arms"][1:]:
        usable = a["goodput"] and not any(a["failed"])
        gains[a["label"]] = (paired_gain(base["goodput"], a["goodput"], floor=floor)
                             if usable else None)
    decision = decide(gains, min_gain=min_gain)
    return {**record, "floor": floor,
            "gains": {k: (dataclasses.asdict(g) if g else None) for k, g in gains.items()},
            "decision": {"winner": decision.winner, "reason": decision.reason}}


def mean_figures(arm: dict) -> dict:
    """Numeric figures of an arm, averaged over its rounds."""
    keys = {k for f in arm["figures"] for k, v in f.items() if isinstance(v, (int, float))}
    return {k: statistics.fmean(f[k] for f in arm["figures"] if k in f) for k in keys}
