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

from tuner.search import study as st
from tuner.search.space import SETTINGS, engine_flags, from_engine_spec
from tuner.search.stats import decide, paired_gain
from tuner.measure.trial import Infeasible

BASELINE = "baseline"


@dataclass(frozen=True)
class Baseline:
    """The current settings: `params` describe them, `flags` start the engine with them."""

    params: dict
    flags: tuple[str, ...]
    source: str   # "engine defaults" or the --baseline file


def engine_defaults(names) -> dict:
    """The engine's own defaults (EngineConfig) for these settings; unset ones left out.
    engine/config.py is loaded by itself: importing the `engine` package imports torch."""
    import importlib.util
    name = "_tuner_engine_config"
    if name not in sys.modules:
        package = importlib.util.find_spec("engine")
        path = Path(package.submodule_search_locations[0]) / "config.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    defaults = {f.name: f.default for f in dataclasses.fields(sys.modules[name].EngineConfig)}
    return {n: defaults[n] for n in names if defaults.get(n) is not None}


def load_baseline(path: str | None, *, fixed: dict, searched: list[str]) -> Baseline:
    """The engine defaults (plus --set), or a YAML file holding a spec.engine fragment:
    `spec: {engine: {...}}`, `engine: {...}` or the bare mapping. ValueError names the
    problem."""
    if path is None:
        params = {**engine_defaults(searched), **fixed}
        return Baseline(params, tuple(engine_flags(fixed)), "engine defaults")
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"--baseline {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--baseline {path}: not YAML ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        doc = doc["spec"]
    if isinstance(doc, dict) and isinstance(doc.get("engine"), dict):
        doc = doc["engine"]
    if not isinstance(doc, dict) or not doc:
        raise ValueError(f"--baseline {path}: expected a spec.engine mapping such as "
                         "'spec: {engine: {maxNumSeqs: 16}}'")
    settings = from_engine_spec(doc, where=f"--baseline {path}")
    params = {**fixed, **settings}
    return Baseline(params, tuple(engine_flags(params)), str(path))


def candidates(study: optuna.Study, k: int, baseline: Baseline) -> list[dict]:
    """The best k settings of the search (Pareto-optimal first in pareto mode), minus
    any that equal the baseline."""
    groups = st.ranked_groups(study)
    same = {n: v for n, v in baseline.params.items() if n in SETTINGS}
    return [g for g in groups if {**same, **g["params"]} != same][:k]


def _arm(label: str, params: dict, flags, trials: list[int], source: str = "search") -> dict:
    return {"label": label, "params": params, "flags": list(flags), "trials": trials,
            "source": source, "goodput": [], "failed": [], "figures": []}


def run_confirmation(study: optuna.Study, *, baseline: Baseline, k: int, rounds: int,
                     seed: int, floor: float, out_dir: Path, fixed: dict,
                     measure: Callable[[list[str], int, Path], dict],
                     log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                     min_gain: float = 1.0) -> dict:
    """Measure baseline and candidates `rounds` times interleaved; store and return the
    confirmation record. `measure(flags, seed, workdir)` returns a trial's figures or
    raises Infeasible."""
    arms = [_arm(BASELINE, baseline.params, baseline.flags, [], baseline.source)]
    for i, g in enumerate(candidates(study, k, baseline), start=1):
        arms.append(_arm(f"C{i}", {**fixed, **g["params"]},
                         engine_flags({**fixed, **g["params"]}), g["trials"]))
    record = study.user_attrs.get("confirmation")
    if not (record and [(a["label"], a["params"], a["flags"]) for a in record["arms"]]
            == [(a["label"], a["params"], a["flags"]) for a in arms]):
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
            workdir = out_dir / "confirm" / f"round-{r}" / a["label"]
            try:
                figures = measure(a["flags"], seed + 1 + r, workdir)
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
