"""How many API requests one PagedInferenceService costs the operator, counted by the local
cluster's API server with the operator as its own process (benchmarks/operator_scale.py's
own run, at a small count): end to end from creation (children written, status set, the
events that follow handled), then one resync pass. Counts, not time: the same on any
machine."""
from __future__ import annotations

import asyncio

from benchmarks.operator_scale import run

COUNT = 10
# Children of the benchmark's spec: ConfigMap, Service, Deployment, PodDisruptionBudget,
# NetworkPolicy, and a PodMonitor (the local API server serves its CRD).
CHILDREN = 6
# What the operator does once, whatever the count (the discovery GETs for PodMonitor and
# KEDA, a watch renewed meanwhile): a few requests, shared by COUNT resources.
SHARED = 2 / COUNT
# A fresh resource, by design (operator/paged_operator/reconcile.py):
#   one POST per child (written first; read only on a 409)                       CHILDREN
#   kopf's two PATCHes of the resource (finalizer, handled-configuration) and
#   the status PATCH                                                                    3
#   the Deployment's ADDED event: GET the owner, LIST its pods (the Deployment
#   itself comes with the event)                                                        2
#   a second status PATCH, when that event's read of the owner predates the first       1
# Reading every child before writing it (the old pattern) adds CHILDREN GETs; looking for
# the eight optional children the spec does not want adds 8 more: both land far above.
CREATION_BOUND = CHILDREN + 3 + 2 + 1 + SHARED
# A resync pass: GET each wanted child, LIST the pods (skipped here: no Deployment
# controller runs, so no Deployment has a status, and pods come only after one has), GET
# the one unwanted child whose wanting depends on the cluster (the HPA; KEDA's API is not
# served here), and a status PATCH should the pass find it changed. Looking for all eight
# unwanted children: +7.
RESYNC_BOUND = CHILDREN + 1 + 1 + 1 + SHARED


def test_a_new_service_and_its_resync_cost_bounded_numbers_of_requests():
    # 15 s: the creation of 10 settles (3 s without a request) long before the first pass
    result = asyncio.run(run(COUNT, resync=15.0, timeout=120.0))
    assert result["children"] == CHILDREN, result["kinds"]   # one POST per child, no retries
    assert CHILDREN + 3 <= result["requests"] <= CREATION_BOUND, result["kinds"]
    assert CHILDREN <= result["resync_requests"] <= RESYNC_BOUND, result
