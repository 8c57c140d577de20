"""The user's path with the real kubectl binary: apply the documented example, watch the
operator serve it, delete it. kubectl talks to the emulated API server like to a cluster."""
from __future__ import annotations

import pytest
from operator_harness import DEPLOYMENTS, NAMESPACE, PIS, condition, eventually, kubectl

pytestmark = pytest.mark.asyncio


async def test_kubectl_apply_example_then_delete(cluster, operator):
    out = await kubectl(cluster, "apply", "-f", "examples/service.yaml", "--validate=false")
    assert "pagedinferenceservice.serving.pagedinference.dev/qwen created" in out
    dep = await eventually(lambda: cluster.live(DEPLOYMENTS).get((NAMESPACE, "qwen")))
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:7] == ["Qwen/Qwen2.5-0.5B-Instruct", "--host", "0.0.0.0", "--port", "8000",
                        "--served-model-name", "qwen"]
    assert "--max-model-len" in args and "4096" in args
    await eventually(lambda: condition(cluster.live(PIS)[NAMESPACE, "qwen"], "Ready"))
    endpoint = await kubectl(cluster, "get", "pagedinferenceservices.serving.pagedinference.dev",
                             "qwen", "-o", "jsonpath={.status.endpoint}")
    assert endpoint == "http://qwen.llm.svc.cluster.local:8000"
    await kubectl(cluster, "delete", "-f", "examples/service.yaml", "--wait=false")
    await eventually(lambda: not cluster.live(PIS) and not cluster.live(DEPLOYMENTS),
                     message="everything deleted")
