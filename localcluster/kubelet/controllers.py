"""The controllers kube-controller-manager runs, reduced to what our components use:
Deployment -> ReplicaSets (rolling update or recreate), ReplicaSet -> Pods, Job -> Pods (with
`completionMode: Indexed`: one pod per index, its index in the annotation and label
batch.kubernetes.io/job-completion-index and in $JOB_COMPLETION_INDEX), and
Service -> EndpointSlice. Each `reconcile` pass reads the store and writes what is missing."""
from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

from ..api import writes
from ..api.selectors import match_labels
from .probes import resolve_port


INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def owned(objs: list[dict[str, Any]], owner: dict[str, Any]) -> list[dict[str, Any]]:
    uid = owner["metadata"]["uid"]
    return [o for o in objs if any(r.get("uid") == uid and r.get("controller")
                                   for r in o["metadata"].get("ownerReferences") or [])]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _alive(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get(
        "phase") not in ("Succeeded", "Failed")


def _scaled(value: Any, total: int, up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        f = int(value[:-1]) * total / 100
        return math.ceil(f) if up else math.floor(f)
    return int(value)


class Controllers:
    def __init__(self, kubelet: Any) -> None:
        self.k = kubelet
        self.store = kubelet.api.store

    def items(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return list(self.store.items(self.k.kind(plural), namespace))

    def _set_status(self, plural: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if obj.get("status") != status:
            new = copy.deepcopy(obj)
            new["status"] = status
            self.store.update(self.k.kind(plural), new)

    def reconcile(self) -> None:
        for dep in self.items("deployments"):
            self.deployment(dep)
        for rs in self.items("replicasets"):
            self.replicaset(rs)
        for job in self.items("jobs"):
            self.job(job)
        for svc in self.items("services"):
            self.endpoint_slice(svc)

    # ---- Deployment -> ReplicaSets ----
    def deployment(self, dep: dict[str, Any]) -> None:
        if dep["metadata"].get("deletionTimestamp"):
            return
        ns, spec = dep["metadata"]["namespace"], dep["spec"]
        template = spec["template"]
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        sets = owned(self.items("replicasets", ns), dep)
        current = next((rs for rs in sets if rs["metadata"]["labels"].get(
            "pod-template-hash") == digest), None)
        desired = int(spec.get("replicas", 1))
        if current is None:
            tmpl = copy.deepcopy(template)
            tmpl.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = digest
            selector = copy.deepcopy(spec["selector"])
            selector.setdefault("matchLabels", {})["pod-template-hash"] = digest
            current = writes.create(self.store, self.k.kind("replicasets"), ns, {
                "metadata": {"name": f"{dep['metadata']['name']}-{digest}",
                             "labels": tmpl["metadata"]["labels"],
                             "ownerReferences": [_owner(dep)]},
                "spec": {"replicas": 0, "selector": selector, "template": tmpl}})
            sets.append(current)
        old = [rs for rs in sets if rs is not current]
        ready = lambda rs: (rs.get("status") or {}).get("readyReplicas", 0)  # noqa: E731
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate":
            for rs in old:
                self._scale(rs, 0)
            old_pods = sum((rs.get("status") or {}).get("replicas", 0) for rs in old)
            self._scale(current, desired if old_pods == 0 else 0)
        else:
            rolling = strategy.get("rollingUpdate") or {}
            surge = _scaled(rolling.get("maxSurge", "25%"), desired, up=True)
            unavailable = _scaled(rolling.get("maxUnavailable", "25%"), desired, up=False)
            if surge == 0 and unavailable == 0:
                unavailable = 1
            old_count = sum(rs["spec"].get("replicas", 0) for rs in old)
            # scale the new set up within the surge, the old ones down as new pods turn ready
            self._scale(current, min(desired, max(current["spec"].get("replicas", 0),
                                                  desired + surge - old_count)))
            budget = max(0, old_count - max(0, desired - unavailable - ready(current)))
            for rs in old:
                take = min(budget, rs["spec"].get("replicas", 0))
                budget -= take
                self._scale(rs, rs["spec"].get("replicas", 0) - take)
        self._deployment_status(dep, current, sets)

    def _scale(self, rs: dict[str, Any], replicas: int) -> None:
        if rs["spec"].get("replicas") != replicas:
            new = copy.deepcopy(rs)
            new["spec"]["replicas"] = replicas
            rs.update(self.store.update(self.k.kind("replicasets"), new))

    def _deployment_status(self, dep: dict[str, Any], current: dict[str, Any],
                           sets: list[dict[str, Any]]) -> None:
        st = lambda rs, key: (rs.get("status") or {}).get(key, 0)  # noqa: E731
        desired = int(dep["spec"].get("replicas", 1))
        total = sum(st(rs, "replicas") for rs in sets)
        ready = sum(st(rs, "readyReplicas") for rs in sets)
        updated = st(current, "replicas")
        complete = updated == desired and total == desired and st(current, "readyReplicas") \
            == desired
        old = {c["type"]: c for c in (dep.get("status") or {}).get("conditions") or []}

        def cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
            status = "True" if ok else "False"
            prev = old.get(type_)
            since = prev["lastTransitionTime"] if prev and prev["status"] == status \
                else writes.now()
            return {"type": type_, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": since, "lastUpdateTime": since}
        name = current["metadata"]["name"]
        status = {"observedGeneration": dep["metadata"]["generation"], "replicas": total,
                  "updatedReplicas": updated, "readyReplicas": ready,
                  "availableReplicas": ready, "unavailableReplicas": max(0, total - ready),
                  "conditions": [
                      cond("Available", ready >= desired, "MinimumReplicasAvailable"
                           if ready >= desired else "MinimumReplicasUnavailable",
                           "Deployment has minimum availability."),
                      cond("Progressing", True, "NewReplicaSetAvailable" if complete
                           else "ReplicaSetUpdated", f'ReplicaSet "{name}" is progressing.')]}
        status = {k: v for k, v in status.items() if v != 0 or k == "observedGeneration"}
        self._set_status("deployments", dep, status)

    # ---- ReplicaSet -> Pods ----
    def _pods_of(self, owner: dict[str, Any]) -> list[dict[str, Any]]:
        return owned(self.items("pods", owner["metadata"]["namespace"]), owner)

    def _new_pod(self, owner: dict[str, Any], index: int | None = None) -> None:
        tmpl = owner["spec"]["template"]
        meta = tmpl.get("metadata") or {}
        labels, notes = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
        spec = copy.deepcopy(tmpl["spec"])
        prefix = f"{owner['metadata']['name']}-"
        if index is not None:   # an Indexed Job's pod, as the Job controller makes it
            labels[INDEX_KEY] = notes[INDEX_KEY] = str(index)
            prefix += f"{index}-"
            for container in spec.get("containers") or []:
                container["env"] = [*(container.get("env") or []),
                                    {"name": "JOB_COMPLETION_INDEX", "value": str(index)}]
        writes.create(self.store, self.k.kind("pods"), owner["metadata"]["namespace"], {
            "metadata": {"generateName": prefix, "labels": labels, "annotations": notes,
                         "ownerReferences": [_owner(owner)]},
            "spec": {**spec, "nodeName": "local"}})

    def replicaset(self, rs: dict[str, Any]) -> None:
        if rs["metadata"].get("deletionTimestamp"):
            return
        pods = [p for p in self._pods_of(rs) if _alive(p)]
        want = int(rs["spec"].get("replicas", 1))
        for _ in range(want - len(pods)):
            self._new_pod(rs)
        if len(pods) > want:   # the not-ready and youngest go first
            extra = sorted(pods, key=lambda p: (_ready(p), p["metadata"]["creationTimestamp"]))
            for pod in extra[: len(pods) - want]:
                self.store.delete(self.k.kind("pods"), pod["metadata"]["namespace"],
                                  pod["metadata"]["name"])
        pods = [p for p in self._pods_of(rs) if _alive(p)]
        ready = sum(1 for p in pods if _ready(p))
        status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods),
                  "readyReplicas": ready, "availableReplicas": ready,
                  "observedGeneration": rs["metadata"]["generation"]}
        self._set_status("replicasets", rs, {k: v for k, v in status.items()
                                             if v or k in ("replicas", "observedGeneration")})

    # ---- Job -> Pods ----
    def job(self, job: dict[str, Any]) -> None:
        if job["metadata"].get("deletionTimestamp"):
            return
        spec, status = job["spec"], copy.deepcopy(job.get("status") or {})
        pods = self._pods_of(job)
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        active = sum(1 for p in pods if _alive(p))
        if spec.get("completionMode") == "Indexed":   # complete when every index succeeded
            done_indexes = sorted({int(p["metadata"]["annotations"][INDEX_KEY]) for p in pods
                                   if (p.get("status") or {}).get("phase") == "Succeeded"})
            succeeded = len(done_indexes)
            status["completedIndexes"] = ",".join(map(str, done_indexes))
        done = any(c["type"] in ("Complete", "Failed") for c in status.get("conditions") or [])
        if not done:
            if succeeded >= int(spec.get("completions", 1)):
                status["conditions"] = [{"type": "Complete", "status": "True",
                                         "lastTransitionTime": writes.now()}]
                status["completionTime"] = writes.now()
            elif failed > int(spec.get("backoffLimit", 6)):
                status["conditions"] = [{"type": "Failed", "status": "True",
                                         "reason": "BackoffLimitExceeded",
                                         "lastTransitionTime": writes.now()}]
            elif spec.get("completionMode") == "Indexed":
                active += self._start_indexes(job, pods)
            elif active < int(spec.get("parallelism", 1)):
                for _ in range(int(spec.get("parallelism", 1)) - active):
                    self._new_pod(job)
                active = int(spec.get("parallelism", 1))
        status.setdefault("startTime", writes.now())
        status.update(active=active, succeeded=succeeded, failed=failed)
        self._set_status("jobs", job, {k: v for k, v in status.items() if v})

    def _start_indexes(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """A pod for each index with none running or succeeded, up to `parallelism`
        running; returns how many were started."""
        spec = job["spec"]
        taken = {int(p["metadata"]["annotations"][INDEX_KEY]) for p in pods
                 if _alive(p) or (p.get("status") or {}).get("phase") == "Succeeded"}
        room = int(spec.get("parallelism", 1)) - sum(1 for p in pods if _alive(p))
        started = 0
        for index in range(int(spec.get("completions", 1))):
            if index not in taken and started < room:
                self._new_pod(job, index)
                started += 1
        return started

    # ---- Service -> EndpointSlice ----
    def endpoint_slice(self, svc: dict[str, Any]) -> None:
        selector = svc["spec"].get("selector")
        if not selector or svc["metadata"].get("deletionTimestamp"):
            return
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        pods = [p for p in self.items("pods", ns) if match_labels(
            {"matchLabels": selector}, p["metadata"].get("labels") or {})
            and (p.get("status") or {}).get("podIP") and _alive(p)]
        ports = []
        for port in svc["spec"].get("ports") or []:
            target = port.get("targetPort", port["port"])
            number = None
            for pod in pods:
                try:
                    number = resolve_port(target, pod["spec"]["containers"][0])
                    break
                except ValueError:
                    continue
            ports.append({"name": port.get("name", ""), "protocol": port.get("protocol", "TCP"),
                          "port": number if number is not None else
                          (target if isinstance(target, int) else port["port"])})
        body = {"addressType": "IPv4", "ports": ports, "endpoints": [
            {"addresses": [p["status"]["podIP"]], "conditions": {
                "ready": _ready(p), "serving": _ready(p), "terminating": False},
             "targetRef": {"kind": "Pod", "namespace": ns, "name": p["metadata"]["name"],
                           "uid": p["metadata"]["uid"]}} for p in pods]}
        kind = self.k.kind("endpointslices")
        current = self.store.get(kind, ns, f"{name}-local")
        if current is None:
            writes.create(self.store, kind, ns, {"metadata": {
                "name": f"{name}-local", "labels": {"kubernetes.io/service-name": name,
                                                    "endpointslice.kubernetes.io/managed-by":
                                                    "paged-localcluster"},
                "ownerReferences": [_owner(svc)]}, **body})
        elif {k: current.get(k) for k in body} != body:
            self.store.update(kind, {**copy.deepcopy(current), **body})
