"""A resource's first pass writes first and skips looking for unwanted children only while
nothing but this very spec can have made them (reconcile.py): an operator killed mid-way
through a first pass, and a spec changed before the next one, must not leave a child the
new spec does not want."""
from __future__ import annotations

import pytest
from operator_harness import NAMESPACE, PIS, Operator, api_path, call, eventually, pis_body

pytestmark = pytest.mark.asyncio

SPEC = {"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}, "router": {"enabled": True}}
SERVICE_ACCOUNTS = "v1/serviceaccounts"


async def test_a_first_pass_after_a_spec_change_removes_what_the_earlier_spec_made(cluster):
    # No operator yet. The resource asked for the router, and a first pass killed mid-way
    # made the router's ServiceAccount; then the router was turned off (generation 2).
    owner = await call(cluster, "POST", api_path(PIS), pis_body("qwen", SPEC))
    await call(cluster, "POST", api_path(SERVICE_ACCOUNTS), {
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "qwen-router", "namespace": NAMESPACE, "ownerReferences": [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": "qwen",
            "uid": owner["metadata"]["uid"], "controller": True}]}})
    await call(cluster, "PATCH", api_path(PIS, "qwen"), {"spec": {"router": {"enabled": False}}})
    assert cluster.live(PIS)[NAMESPACE, "qwen"]["metadata"]["generation"] == 2
    operator = Operator()
    await operator.start()   # its create handler's first try: no status yet
    try:
        await eventually(lambda: (NAMESPACE, "qwen-router")
                         not in cluster.live(SERVICE_ACCOUNTS),
                         message="the earlier spec's ServiceAccount to be deleted")
        await eventually(lambda: (cluster.live(PIS)[NAMESPACE, "qwen"].get("status") or {})
                         .get("observedGeneration") == 2, message="the status")
    finally:
        await operator.stop()
