"""The decision, and what `spec.apply.mode` does with it.

- Always: status.best / gain / decision, and a ConfigMap `<tuning>-recommendation` with the
  patch (`patch.yaml`, a `kubectl patch` line): for GitOps users the patch goes to their
  repository; an in-cluster edit would be reverted by Argo CD or Flux.
- Manual: nothing else (APPLIED = Manual when there is a winner).
- Auto: when the winner's lower bound exceeds spec.apply.minGain, the target's spec.engine
  is patched, its previous settings and the tuning resource recorded in annotations; the
  rollout is awaited; a short load (spec.trialDuration) on the live service verifies the
  gain: its goodput must exceed the baseline's goodput measured in the confirmation (both
  floored at half a request per load window, as the confirmation does), else the previous
  settings are patched back (APPLIED = RolledBack).
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import TYPE_CHECKING, Any

import yaml

from tuner.cluster_spec import GROUP, camel
from tuner.stats import t975
from tuner.trial import Infeasible, measure

if TYPE_CHECKING:
    from tuner.cluster import Tuning

PREVIOUS = f"{GROUP}/previous-engine"
APPLIED_BY = f"{GROUP}/applied-by"


def arm_goodput(arm: dict) -> dict[str, Any]:
    """Mean goodput of a confirmation arm with its 95 % t-interval over the rounds."""
    values = [g for g, failed in zip(arm["goodput"], arm["failed"]) if not failed]
    if not values:
        return {"goodput": 0.0}
    mean = statistics.fmean(values)
    out: dict[str, Any] = {"goodput": round(mean, 4), "rounds": len(values)}
    if len(values) > 1:
        half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        out["goodputInterval"] = [round(mean - half, 4), round(mean + half, 4)]
    return out


def _gain_text(gain: dict) -> str:
    return f"{gain['ratio']:.2f}x [{gain['low']:.2f}, {gain['high']:.2f}]"


def apply_decision(run: "Tuning", record: dict) -> None:
    decision = dict(record["decision"])
    arms = {a["label"]: a for a in record["arms"]}
    gains = {k: g for k, g in (record.get("gains") or {}).items() if g}
    if decision["winner"] is not None and gains[decision["winner"]]["ratio"] <= 1:
        # a minGain below 1 lets a lower bound under 1 through: never recommend (or apply)
        # a setting that measured worse than the baseline
        decision = {"winner": None, "reason": f"{decision['winner']} measured no better "
                    f"than the baseline: gain {_gain_text(gains[decision['winner']])}"}
    # the arm the decision is about: the winner, else the best lower bound
    label = decision["winner"] or (max(gains, key=lambda k: gains[k]["low"]) if gains else None)
    reason = decision["reason"]
    if decision["winner"] is None and gains and reason.startswith("no significant"):
        reason += f" (a winner's lower bound must exceed spec.apply.minGain {run.spec.min_gain:g})"
    fields: dict[str, Any] = {"decision": {"winner": decision["winner"], "reason": reason}}
    if label is not None:
        gain = gains.get(label)
        fields["best"] = {"engine": camel(arms[label]["params"]), "source": "confirmation",
                          **arm_goodput(arms[label])}
        if gain:
            fields["gain"] = {"ratio": round(gain["ratio"], 4), "low": round(gain["low"], 4),
                              "high": round(gain["high"], 4), "rounds": gain["rounds"],
                              "text": _gain_text(gain)}
    if decision["winner"] is None:
        run.publish(**fields, phase="Succeeded", applied="No")
        return
    engine = camel(arms[label]["params"])
    target = run.spec.target
    patch = {"spec": {"engine": engine}}
    run.cluster.put_config_map(f"{run.name}-recommendation", {
        "patch.yaml": yaml.safe_dump(patch, sort_keys=True),
        "kubectl": f"kubectl patch pis {target} --type=merge -p '{json.dumps(patch)}'",
        "decision": decision["reason"]}, run.owner)
    fields["recommendation"] = {"configMap": f"{run.name}-recommendation", "patch": patch}
    if run.spec.mode == "Manual":
        run.publish(**fields, phase="Succeeded", applied="Manual")
        return
    run.publish(**fields, phase="Applying")
    _apply_and_verify(run, engine, arm_goodput(arms["baseline"])["goodput"])


def _apply_and_verify(run: "Tuning", engine: dict, baseline_goodput: float) -> None:
    cluster, target = run.cluster, run.spec.target
    live = cluster.get_service(target)
    previous = dict(live["spec"].get("engine") or {})
    new = {**previous, **engine}
    patched = cluster.patch_service(target, {
        "metadata": {"annotations": {PREVIOUS: json.dumps(previous, sort_keys=True),
                                     APPLIED_BY: run.name}},
        "spec": {"engine": new}})
    run.publish(phase="Verifying", applied="Yes",
                appliedEngine=new, previousEngine=previous)
    try:
        cluster.wait_ready(target, timeout=run.spec.startup_timeout,
                           generation=patched["metadata"]["generation"])
        url = cluster.endpoint_url(target)
        figures = measure(url, dataclasses.replace(run.load, seed=run.spec.seed + 1000),
                          run.slos, workdir=run.out_dir / "verify",
                          warmup_requests=run.spec.warmup_requests, prometheus=run.prometheus)
        goodput = figures["goodput"]
        floor = 0.5 / run.spec.duration   # as the confirmation floors a goodput of 0
        held = max(goodput, floor) > max(baseline_goodput, floor)
        why = (f"verified on {target}: goodput {goodput:.3f} req/s vs the baseline's "
               f"{baseline_goodput:.3f}")
    except Infeasible as exc:
        goodput, held, why = 0.0, False, f"{target} did not roll out: {exc.reason}"
    verification = {"goodput": round(goodput, 4), "baselineGoodput": round(baseline_goodput, 4),
                    "held": held, "message": why}
    if held:
        run.publish(phase="Succeeded", verification=verification)
        return
    run.publish(phase="RollingBack", verification=verification)
    # merge patch: keys the candidate added and the previous settings lacked are removed
    restore = {key: previous.get(key) for key in {**new, **previous}}
    rolled = cluster.patch_service(target, {
        "metadata": {"annotations": {PREVIOUS: None, APPLIED_BY: None}},
        "spec": {"engine": restore}})
    try:
        cluster.wait_ready(target, timeout=run.spec.startup_timeout,
                           generation=rolled["metadata"]["generation"])
    except Infeasible as exc:
        why += f"; the rollback has not rolled out yet: {exc.reason}"
    reason = run.status["decision"]["reason"]
    run.publish(phase="Succeeded", applied="RolledBack",
                decision={**run.status["decision"],
                          "reason": f"{reason}; rolled back: the gain did not hold ({why})"})
