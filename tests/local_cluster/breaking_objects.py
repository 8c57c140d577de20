"""Custom resources of the chart's CRDs for tests/local_cluster/test_api_strict.py: the
builders `pis` and `pit`, and BREAKING, one object per CEL rule that breaks it."""
from __future__ import annotations

from typing import Any

GROUP = "serving.pagedinference.dev/v1alpha1"


def pis(name: str = "svc", **spec: Any) -> dict[str, Any]:
    base = {"model": {"uri": "builtin://default"}, "resources": {"gpus": 0}}
    return {"apiVersion": GROUP, "kind": "PagedInferenceService", "metadata": {"name": name},
            "spec": {**base, **spec}}


def pit(name: str = "tune", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "PagedInferenceTuning", "metadata": {"name": name},
            "spec": {"targetRef": {"name": "svc"}, **spec}}


# One object per CEL rule of the chart's CRDs, each breaking it (and only it).
BREAKING = [
    pis("x" * 53),
    pis(model={"uri": "pvc://models/../etc"}),
    pis(engine={"maxNumSeqs": 64, "maxNumBatchedTokens": 32}),
    pis(engine={"extraArgs": ["--block-size=8"]}),
    pis(autoscaling={"minReplicas": 3, "maxReplicas": 2}),
    pis(autoscaling={"minReplicas": 0, "maxReplicas": 2},               # mode metrics
        router={"enabled": True}),
    pis(autoscaling={"mode": "slo", "minReplicas": 0, "maxReplicas": 2,  # no router
                     "slo": {"ttftSeconds": 1}}),
    pis(autoscaling={"mode": "slo", "maxReplicas": 2}),                 # no slo
    pis(modelCache={"storageClassName": "fast"}),
    pis(engine={"speculative": {"method": "ngram", "numSpeculativeTokens": 4,
                                "promptLookupMin": 5, "promptLookupMax": 2}}),
    pis(engine={"speculative": {"method": "suffix", "numSpeculativeTokens": 8,
                                "promptLookupMax": 4}}),
    pis(engine={"speculative": {"numSpeculativeTokens": 4,   # method unset: ngram
                                "suffixDecodingMaxTreeDepth": 32}}),
    pis(kvCache={"disk": {"sizeGiB": 1, "volume": {
        "emptyDir": {}, "persistentVolumeClaim": {"claimName": "kv"}}}}),
    pis(engine={"enablePrefixCaching": False}, kvCache={"offloadGiB": 1}),
    pit("t" * 39),
    pit(users=2, rate=1.0),
    pit(workload="chat", workloadFrom={"prometheus": {}}, prometheus={"url": "http://p"}),
    pit(workloadFrom={"prometheus": {}}),
    pit(apply={"verifyWindow": "5m"}),
    pit(tunerPods=2),
    pit(objective="Capacity", rate=1.0),
    pit(objective="Capacity", tunerPods=2, storage={"secretRef": {"name": "db"}}),
    pit(workloadFrom={"trace": {"url": "http://t"}, "prometheus": {}},
        prometheus={"url": "http://p"}),
    pit(workloadFrom={"trace": {"configMapRef": {"name": "c"}, "url": "http://t"}}),
]
