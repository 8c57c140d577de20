"""In-cluster tuning end to end on the real engine: a PagedInferenceService serving the
embedded tiny model (one CPU thread, from the operator's PAGED_CPU_THREADS) with
maxNumSeqs 1, and a PagedInferenceTuning on the chat workload (4 closed-loop users) with
apply.mode Auto. The Job searches maxNumSeqs {4, 8} on two trial services at once,
confirms baseline vs best in 2 interleaved rounds, applies the winner to the live service,
rolls its pod and verifies there.

The space holds a clearly better setting: with maxNumSeqs 1, three of the four users wait
for the one running request, so their TTFT misses the SLO; batching them costs a CPU
decode step little: the gain measured 2.10x [1.66, 2.65] and 1.73x [0.42, 7.11] in two
runs here, and 1.09x [0.01, 120.76] in a CI run (2026-12-05) where one of the best's two
rounds read under the baseline's while the other xdist worker loaded the 2 cores; the
live service then verified 15.7 vs 8.7 req/s. Neither the ratio nor its lower bound is
robust at 2 rounds (Student's t 12.7) on a shared machine. So minGain is 0 (the tuner
still applies nothing that measured worse than the baseline: a winner means a ratio
above 1), and the test asserts the loop: status figures, the winner, the applied
spec.engine, the rolled pod, and the verification on the live service (held, or rolled
back to the target's settings). The gain's size is asserted where a capacity search
measures it (test_capacity_tuning_on_the_real_engine).
"""
from __future__ import annotations

import json
import math
import statistics
import time

import pytest

from tuning_harness import ENGINE_DEFAULTS, apply, finished, trial_services

pytestmark = pytest.mark.xdist_group("local_cluster_tuning_real")

LOCAL_CLUSTER_ARGS = ["--no-postgres"]
PREVIOUS = "serving.pagedinference.dev/previous-engine"
ENGINE = {"blockSize": 16, "maxNumSeqs": 1, "maxModelLen": 1024}
STORED = {**ENGINE_DEFAULTS, **ENGINE}   # as the API server stores it: the CRD's defaults in


def service() -> dict:
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceService", "metadata": {"name": "tiny"},
            "spec": {"model": {"uri": "builtin://default", "servedName": "tiny"},
                     "replicas": 1, "engine": dict(ENGINE),
                     "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi",
                                   "sharedMemory": "64Mi"},
                     "rollout": {"startupTimeoutSeconds": 180}}}


def tuning() -> dict:
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceTuning", "metadata": {"name": "tiny-auto"},
            "spec": {"targetRef": {"name": "tiny"}, "workload": "chat", "trials": 2,
                     "parallelism": 2, "trialDuration": "8s", "users": 4,
                     "lengthScale": 0.25, "warmupRequests": 1,
                     "slo": {"ttftSeconds": 1.5, "itlSeconds": 0.5},
                     "searchSpace": {"maxNumSeqs": [4, 8]},
                     "confirm": {"rounds": 2}, "startupTimeout": "180s",
                     "apply": {"mode": "Auto", "minGain": 0}}}


def test_auto_tuning_on_the_real_engine(local_cluster) -> None:
    cluster = local_cluster
    apply(cluster, service())
    cluster.kubectl("wait", "pis/tiny", "--for=condition=Ready", "--timeout=200s", timeout=210)
    (pod,) = cluster.pods("app.kubernetes.io/instance=tiny")
    env = {e["name"]: e.get("value") for e in
           cluster.json("get", "deploy", "tiny")["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["PAGED_CPU_THREADS"] == "1"
    started = time.monotonic()
    apply(cluster, tuning())
    status = finished(cluster, "tiny-auto", timeout=600)["status"]
    wall = time.monotonic() - started
    print(f"\nreal-engine tuning: {wall:.0f} s; baseline {status['baseline']}; "
          f"best {status['best']}; gain {status['gain']}; "
          f"verification {status.get('verification')}")
    # the search: both settings measured on real engines
    assert status["trialsText"] == "2/2"
    assert sorted(e["engine"]["maxNumSeqs"] for e in status["history"]) == [4, 8]
    assert all(e.get("goodput", 0) > 0 for e in status["history"]), status["history"]
    # the confirmation: baseline (the target's settings) vs the best, with intervals
    assert status["baseline"]["engine"] == STORED
    assert status["baseline"]["rounds"] == 2 and len(status["baseline"]["goodputInterval"]) == 2
    assert status["best"]["engine"]["maxNumSeqs"] in (4, 8)
    assert status["best"]["source"] == "confirmation"
    gain = status["gain"]
    assert gain["rounds"] == 2 and gain["low"] <= gain["ratio"] <= gain["high"]
    assert status["decision"]["winner"] == "C1"   # better than the baseline: a ratio above 1
    assert gain["ratio"] > 1, gain
    # Auto: the winner applied to the live service, its pod rolled, then verified there
    assert status["applied"] in ("Yes", "RolledBack"), status["decision"]
    verification = status["verification"]
    assert verification["baselineGoodput"] == status["baseline"]["goodput"]
    live = cluster.json("get", "pis", "tiny")
    now = [p for p in cluster.pods("app.kubernetes.io/instance=tiny")
           if not p["metadata"].get("deletionTimestamp")]
    assert now and pod["metadata"]["name"] not in {p["metadata"]["name"] for p in now}
    if status["applied"] == "Yes":
        assert verification["held"] is True
        assert verification["goodput"] > verification["baselineGoodput"]
        assert live["spec"]["engine"] == {**STORED, **status["best"]["engine"]}
        assert json.loads(live["metadata"]["annotations"][PREVIOUS]) == {"engine": STORED}
    else:   # the gain did not hold on the live service: back to the target's settings
        assert verification["held"] is False and "rolled back" in status["decision"]["reason"]
        assert live["spec"]["engine"] == STORED
    assert trial_services(cluster, "tiny-auto") == []
    cluster.kubectl("wait", "job/tiny-auto-tuner", "--for=condition=Complete",
                    "--timeout=30s", timeout=40)


def capacity_tuning() -> dict:
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceTuning", "metadata": {"name": "tiny-cap"},
            "spec": {"targetRef": {"name": "cap"}, "objective": "Capacity",
                     "workload": "chat", "trials": 6, "trialDuration": "5s",
                     "lengthScale": 0.25, "warmupRequests": 1,
                     "slo": {"ttftSeconds": 1.5, "itlSeconds": 0.5},
                     # not 2: the Job's profile is fitted on the pilot's one-sequence
                     # steps, which cannot tell batch sizes apart (CI 2026-12-07 on a
                     # slow VM: 2, 4 and 8 all simulated at 4.73 req/s, the tie went to
                     # 2, whose real gain was 1.22x [0.91, 1.64]; 8 measured 2.61x before)
                     "searchSpace": {"maxNumSeqs": [1, 4, 8]},
                     # 5: a round starts near the arm's capacity so far, and on 2 shared
                     # cores a round's can fall well below it (CI 2026-12-07: the
                     # baseline's pilot 9.86, round 1 12.43, round 2 failed all 3 probes:
                     # capacity 0); a bracketed search stops at its tolerance anyway
                     "capacity": {"maxProbes": 5}, "confirm": {"rounds": 2},
                     "startupTimeout": "180s", "apply": {"mode": "Auto", "minGain": 0}}}


def test_capacity_tuning_on_the_real_engine(local_cluster) -> None:
    """spec.objective Capacity: a pilot of the target's settings (maxNumSeqs 1) on a trial
    service fits the simulator's step times and pool; six settings are simulated; the best
    and the baseline are measured for real (capacity searches, 2 rounds); the winner is
    applied and verified by an open-loop load at the rate its gain promises."""
    cluster = local_cluster
    body = service()
    body["metadata"]["name"] = "cap"
    body["spec"]["model"]["servedName"] = "cap"
    apply(cluster, body)
    cluster.kubectl("wait", "pis/cap", "--for=condition=Ready", "--timeout=200s", timeout=210)
    started = time.monotonic()
    apply(cluster, capacity_tuning())
    status = finished(cluster, "tiny-cap", timeout=900)["status"]
    print(f"\ncapacity tuning: {time.monotonic() - started:.0f} s; pilot {status['pilot']}; "
          f"simulation {status['simulation']}; confirmation {status['confirmation']}; "
          f"gain {status.get('gain')}; verification {status.get('verification')}")
    # the pilot: a real capacity, whose served steps became the simulator's profile
    assert "failed" not in status["pilot"] and status["pilot"]["capacity"] > 0
    simulation = status["simulation"]
    assert simulation["profile"]["source"] == "live (the pilot's steps)"
    assert simulation["profile"]["heldoutError"] is not None
    assert simulation["settings"] == 6 and status["trialsText"] == "6/6 simulated"
    best_simulated = simulation["best"][0]
    assert best_simulated["capacity"] >= simulation["baselineCapacity"]
    shown = [json.dumps(p["engine"], sort_keys=True) for p in simulation["best"]]
    assert len(shown) == len(set(shown))   # each setting once, however often proposed
    # the confirmation: the baseline and the best simulated setting, for real, twice
    base, c1 = status["confirmation"]
    assert base["label"] == "baseline" and c1["label"] == "C1"
    assert c1["engine"] == best_simulated["engine"] != base["engine"]
    for arm in (base, c1):
        assert len(arm["capacities"]) == 2 and all(c > 0 for c in arm["capacities"]), arm
        assert arm["failed"] == []
    # its step times scaled so that the baseline simulates at its pilot's real capacity
    anchor = simulation["profile"]["anchor"]
    assert anchor["pilotCapacity"] == pytest.approx(status["pilot"]["capacity"], rel=1e-3)
    # (or, where the simulated capacity jumps over the pilot's between two factors
    # within 10 %, at that jump: the search's queue verdict flips on a few % of step
    # time near a one-sequence knee; here 2026-12-07: 5.73 req/s at x0.817, 15.89 at
    # x0.724, pilot 9.51)
    pilot, tried = anchor["pilotCapacity"], anchor["tried"]
    assert tried[0] == [1, simulation["profile"]["anchor"]["simulatedBefore"]]
    faster = max((f for f, c in tried if c > pilot), default=None)   # the bracket's ends
    slower = min((f for f, c in tried if c < pilot), default=None)
    jump = faster and slower and 0 < math.log(slower / faster) < 0.1
    assert 0.75 < simulation["baselineCapacity"] / pilot < 1.33 or jump, simulation
    # the simulator, fitted and anchored on the pilot alone, is near the baseline's rounds
    # (their median, as status.pilot.ofBaselineRounds: one round can fall far below the
    # others on 2 shared cores; CI 2026-12-08: rounds 9.81 and 3.07, pilot 9.63), or the
    # pilot itself read the machine at another speed, and status.pilot says so (CI
    # 2026-12-08, later: pilot 0.92, rounds 2.91 and 1.91, the step times anchored x6.4)
    real = statistics.median(base["capacities"])
    near = 0.4 < simulation["baselineCapacity"] / real < 2.5
    assert near or "another speed" in status["pilot"].get("warning", ""), (simulation, base)
    # batching beats one sequence at a time: the gain is large, its interval consistent
    gain = status["gain"]
    assert gain["rounds"] == 2 and gain["low"] <= gain["ratio"] <= gain["high"]
    assert gain["ratio"] > 1.3, gain
    # the pilot against the baseline's own rounds (a warning only when it drifted)
    assert status["pilot"]["ofBaselineRounds"] == pytest.approx(
        status["pilot"]["capacity"] / statistics.median(base["capacities"]), rel=1e-3)
    assert status["decision"]["winner"] == "C1"
    assert status["best"]["capacity"] == pytest.approx(sum(c1["capacities"]) / 2, rel=1e-3)
    assert status["capacity"]["ratePerReplica"] > 0
    # Auto: applied and verified by an open-loop probe at baseline x the gain's lower bound
    verification = status["verification"]
    assert verification["method"] == "load" and verification["rate"] > 0
    assert verification["baselineCapacity"] > 0
    live = cluster.json("get", "pis", "cap")
    if status["applied"] == "Yes":
        assert verification["held"] is True
        assert verification["attainment"] >= 0.9
        assert live["spec"]["engine"]["maxNumSeqs"] == c1["engine"]["maxNumSeqs"]
    else:
        assert status["applied"] == "RolledBack" and verification["held"] is False
        assert live["spec"]["engine"]["maxNumSeqs"] == 1
    assert trial_services(cluster, "tiny-cap") == []
