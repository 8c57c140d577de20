"""The decision, and what `spec.apply.mode` does with it.

- Always: status.best / gain / decision, and a ConfigMap `<tuning>-recommendation` with the
  patch (`patch.yaml`, a `kubectl patch` line): for GitOps users the patch goes to their
  repository; an in-cluster edit would be reverted by Argo CD or Flux.
- Manual: nothing else (APPLIED = Manual when there is a winner).
- Capacity (when asked for, or for Auto on an autoscaled target): the highest load per
  replica with the winning settings within the SLOs (tuner.incluster.load), in
  status.capacity; with the target's spec.autoscaling, the autoscaler's target it implies
  joins the patch (`spec.autoscaling.target`).
- Auto: when the winner's lower bound exceeds spec.apply.minGain, the target's spec.engine
  (with the host KV tier's spec.kvCache.offloadGiB when the winner sets one, the disk tier
  kept; and spec.autoscaling.target, from the capacity) is patched, the previous values of
  what the patch changes recorded in one annotation ({"engine": ..., "kvCache":
  {"offloadGiB": ...} or null for none, "autoscaling": {"target": ...}}) and the tuning
  resource in another; the rollout is awaited, then the gain is verified:
  with spec.prometheus.url, on the live service's own traffic (tuner.incluster.live_verify: PromQL
  over spec.apply.verifyWindow before the patch and after the rollout, the same queries;
  the goodput after must be positive and at least the one before); without Prometheus, or
  when a window held fewer than live_verify.MIN_REQUESTS requests, by a short load
  (spec.trialDuration) on the live service whose goodput must exceed the baseline's
  goodput measured in the confirmation (both floored at half a request per load window,
  as the confirmation does). If it did not hold, the previous values are patched back,
  all together (APPLIED = RolledBack). status.verification records the method and figures.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any, Callable

import yaml

from tuner.incluster import live_verify
from paged_api.contract import APPLIED_BY, PREVIOUS_ENGINE
from paged_api.search_space import to_spec_patch
from tuner.measure.promql import PrometheusError
from tuner.search.stats import t975
from tuner.measure.runner import Infeasible
from tuner.incluster.run import TuningRun
from tuner.measure.trial import measure



def arm_goodput(arm: dict, figure: str = "goodput") -> dict[str, Any]:
    """Mean `figure` (goodput, or capacity for spec.objective Capacity) of a confirmation
    arm with its 95 % t-interval over the rounds."""
    values = [g for g, failed in zip(arm[figure], arm["failed"]) if not failed]
    if not values:
        return {figure: 0.0}
    mean = statistics.fmean(values)
    out: dict[str, Any] = {figure: round(mean, 4), "rounds": len(values)}
    if len(values) > 1:
        half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        out[f"{figure}Interval"] = [round(mean - half, 4), round(mean + half, 4)]
    return out


def _gain_text(gain: dict) -> str:
    return f"{gain['ratio']:.2f}x [{gain['low']:.2f}, {gain['high']:.2f}]"


def apply_decision(run: TuningRun, record: dict, *,
                   capacity: Callable[..., dict] | None = None,
                   verify_load: Callable[[TuningRun, dict], dict] | None = None) -> None:
    """`capacity(engine, start=rate)`: status.capacity of `engine` (spec.engine keys) from
    a search starting at `rate` req/s; None: no capacity search. `record["figure"]`: what
    the arms measured (default goodput). `verify_load(run, record)`: the verification
    without PromQL (default: a goodput load against the baseline's)."""
    figure = record.get("figure", "goodput")
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
        fields["best"] = {**to_spec_patch(arms[label]["params"]), "source": "confirmation",
                          **arm_goodput(arms[label], figure)}   # engine, kvCache if searched
        if gain:
            fields["gain"] = {"ratio": round(gain["ratio"], 4), "low": round(gain["low"], 4),
                              "high": round(gain["high"], 4), "rounds": gain["rounds"],
                              "text": _gain_text(gain)}
    floor = 0.5 / run.spec.duration   # as the confirmation floors a goodput of 0
    if decision["winner"] is None:
        if capacity is not None and run.spec.capacity is not None:   # the current settings'
            fields["capacity"] = capacity(
                {}, start=max(arm_goodput(arms["baseline"], figure)[figure], floor))
        run.publish(**fields, phase="Succeeded", applied="No")
        return
    patch: dict[str, Any] = {"spec": to_spec_patch(arms[label]["params"])}
    engine, target = patch["spec"]["engine"], run.spec.target
    # settings of other sections (spec.kvCache's host tier), when the space varies them
    sections = {k: v for k, v in patch["spec"].items() if k != "engine"}
    if sections:
        # only what changes: `kvCache: {offloadGiB: null}` merged into a target without
        # kvCache would leave `kvCache: {}` when applied by hand
        live = run.cluster.get_service(target)["spec"]
        for section, wanted in sections.items():
            change = section_change(live, section, wanted)
            if change is None:
                del patch["spec"][section]
            else:
                patch["spec"][section] = change[0]
    if capacity is not None:
        fields["capacity"] = capacity(
            engine, start=max(arm_goodput(arms[label], figure)[figure], floor),
            **({"sections": sections} if sections else {}))
        autoscaler = (fields["capacity"].get("autoscaling") or {}).get("target")
        if autoscaler is not None:
            patch["spec"]["autoscaling"] = {"target": autoscaler}
    data = {"patch.yaml": yaml.safe_dump(patch, sort_keys=True),
            "kubectl": f"kubectl patch pis {target} --type=merge -p '{json.dumps(patch)}'",
            "decision": decision["reason"]}
    if run.source.document:
        data["workload.md"] = run.source.document
    run.cluster.put_config_map(f"{run.name}-recommendation", data, run.owner)
    fields["recommendation"] = {"configMap": f"{run.name}-recommendation", "patch": patch}
    if run.spec.mode == "Manual":
        run.publish(**fields, phase="Succeeded", applied="Manual")
        return
    run.publish(**fields, phase="Applying")
    baseline = arm_goodput(arms["baseline"], figure)[figure]
    title = figure[0].upper() + figure[1:]
    _apply_and_verify(run, patch["spec"], {f"baseline{title}": baseline}, lambda: (
        verify_load(run, record) if verify_load is not None else _verify_goodput(run, baseline)))


def section_change(live_spec: dict[str, Any], section: str, wanted: dict[str, Any]
                   ) -> tuple[dict, dict | None] | None:
    """`wanted`: the merge patch of spec.<section> (`{"offloadGiB": GiB or None: off}`) ->
    (the keys that change, what rolls them back), or None when nothing changes. The
    rollback is the live values (None removes a key), or None (remove the section) when
    the target had no such section at all."""
    live = live_spec.get(section)
    live = live if isinstance(live, dict) else None
    change = {k: v for k, v in wanted.items() if (live or {}).get(k) != v}
    if not change:
        return None
    return change, None if live is None else {k: live.get(k) for k in change}


def _apply_and_verify(run: TuningRun, wanted: dict, baseline: dict,
                      load: Callable[[], dict]) -> None:
    """`wanted`: {"engine": ..., "kvCache": {"offloadGiB": ...}?, "autoscaling": {"target":
    ...}?} to merge into the spec; the sections other than engine and autoscaling are the
    table's (settings_types.Setting.section)."""
    cluster, target = run.cluster, run.spec.target
    live = cluster.get_service(target)
    previous = dict(live["spec"].get("engine") or {})
    new = {**previous, **wanted["engine"]}
    changes: dict[str, Any] = {"engine": new}
    before: dict[str, Any] = {"engine": previous}
    autoscaling = live["spec"].get("autoscaling")
    if "autoscaling" in wanted and autoscaling:
        changes["autoscaling"] = wanted["autoscaling"]
        before["autoscaling"] = {"target": autoscaling.get("target")}   # None: the default
    for section in set(wanted) - {"engine", "autoscaling"}:
        change = section_change(live["spec"], section, wanted[section])
        if change is not None:
            changes[section], before[section] = change
    live_before = _live_baseline(run)
    patched = cluster.patch_service(target, {
        "metadata": {"annotations": {PREVIOUS_ENGINE: json.dumps(before, sort_keys=True),
                                     APPLIED_BY: run.name}},
        "spec": changes})
    extra = {"appliedAutoscaling": changes["autoscaling"],
             "previousAutoscaling": before["autoscaling"]} if "autoscaling" in changes else {}
    for section in set(changes) - {"engine", "autoscaling"}:   # appliedKvCache, ...
        title = section[0].upper() + section[1:]
        extra |= {f"applied{title}": changes[section], f"previous{title}": before[section]}
    run.publish(phase="Verifying", applied="Yes",
                appliedEngine=new, previousEngine=previous, **extra)
    try:
        cluster.wait_ready(target, timeout=run.spec.startup_timeout,
                           generation=patched["metadata"]["generation"])
        # the pods roll when the engine's settings or a section the pods read changes;
        # an autoscaling target alone keeps them
        rolled = new != previous or bool(set(changes) - {"engine", "autoscaling"})
        verification = _verify(run, live_before, load, rolled=rolled)
    except Infeasible as exc:
        verification = {"method": "rollout", "held": False,
                        **{k: round(v, 4) for k, v in baseline.items()},
                        "message": f"{target} did not roll out: {exc.reason}"}
    held, why = verification["held"], verification["message"]
    if held:
        run.publish(phase="Succeeded", verification=verification)
        return
    run.publish(phase="RollingBack", verification=verification)
    # merge patch: keys the candidate added and the previous settings lacked are removed
    restore: dict[str, Any] = {"engine": {key: previous.get(key) for key in {**new, **previous}}}
    if "autoscaling" in before:   # a target that was not set goes back to the default
        restore["autoscaling"] = before["autoscaling"]
    for section in set(before) - {"engine", "autoscaling"}:
        restore[section] = before[section]   # its keys back (None: removed), or no section
    rolled = cluster.patch_service(target, {
        "metadata": {"annotations": {PREVIOUS_ENGINE: None, APPLIED_BY: None}},
        "spec": restore})
    try:
        cluster.wait_ready(target, timeout=run.spec.startup_timeout,
                           generation=rolled["metadata"]["generation"])
    except Infeasible as exc:
        why += f"; the rollback has not rolled out yet: {exc.reason}"
    reason = run.status["decision"]["reason"]
    run.publish(phase="Succeeded", applied="RolledBack",
                decision={**run.status["decision"],
                          "reason": f"{reason}; rolled back: the gain did not hold ({why})"})


def _live_baseline(run: TuningRun) -> dict | None:
    """With Prometheus: the live traffic's figures over the verify window before the patch,
    recorded in status.verification.promql (None without Prometheus)."""
    if run.prometheus is None:
        return None
    sel = live_verify.target_selector(run.cluster.ns, run.spec.target)
    try:
        figures = live_verify.baseline(run.prometheus, sel, window=run.spec.verify_window,
                                       limits=live_verify.slo_limits(run.slos))
    except PrometheusError as exc:   # counts as no traffic: the short load verifies
        figures = {"requests": 0, "error": str(exc)}
    run.publish(verification={"method": "promql", "window": f"{run.spec.verify_window:g}s",
                              "promql": {"selector": sel, "baseline": figures}})
    return figures


def _verify(run: TuningRun, live_before: dict | None, load: Callable[[], dict], *,
            rolled: bool = True) -> dict:
    """status.verification after the rollout: PromQL on the live traffic when there is
    enough of it (`promql`: both windows' figures), else `load()`: a short load against
    the confirmation's baseline (`fallback` says why). `rolled`: the patch replaced the
    pods (the window after then never reads the baseline's pods' template)."""
    target = run.spec.target
    fallback, record = "no spec.prometheus.url", {}
    if live_before is not None:
        promql = {"selector": live_verify.target_selector(run.cluster.ns, target),
                  "baseline": live_before}
        if live_before["requests"] >= live_verify.MIN_REQUESTS:
            try:
                promql["live"] = live_verify.after_rollout(
                    run.prometheus, promql["selector"], window=run.spec.verify_window,
                    limits=live_verify.slo_limits(run.slos),
                    settle_timeout=run.spec.startup_timeout,
                    old_pods=live_before.get("pods", ()) if rolled else ())
            except PrometheusError as exc:
                promql["live"] = {"requests": 0, "error": str(exc)}
        held, why = live_verify.verdict(live_before, promql.get("live"))
        record = {"window": f"{run.spec.verify_window:g}s", "promql": promql}
        if held is not None:
            return {"method": "promql", **record, "held": held,
                    "goodput": promql["live"]["goodput"],
                    "baselineGoodput": live_before["goodput"],
                    "message": f"verified on {target}'s traffic: {why}"}
        fallback = f"too little live traffic for PromQL: {why}"
        run.publish(verification={**record, "method": "load", "fallback": fallback})
    return {**record, "method": "load", "fallback": fallback, **load()}


def _verify_goodput(run: TuningRun, baseline_goodput: float) -> dict:
    """The goodput of a short load on the live service against the baseline's."""
    target = run.spec.target
    figures = measure(run.cluster.endpoint_url(target),
                      dataclasses.replace(run.load, seed=run.spec.seed + 1000),
                      run.slos, workdir=run.out_dir / "verify",
                      warmup_requests=run.spec.warmup_requests, prometheus=run.prometheus)
    goodput = figures["goodput"]
    floor = 0.5 / run.spec.duration   # as the confirmation floors a goodput of 0
    held = max(goodput, floor) > max(baseline_goodput, floor)
    return {"held": held,
            "goodput": round(goodput, 4), "baselineGoodput": round(baseline_goodput, 4),
            "message": f"verified on {target} with a {run.spec.duration:g} s load: goodput "
                       f"{goodput:.3f} req/s vs the baseline's {baseline_goodput:.3f}"}
