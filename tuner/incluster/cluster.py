"""The tuning Job's API calls, through the official `kubernetes` client: exactly what its
Role allows (operator/paged_operator/tuning_manifests.py, `tuner_role`):

- pagedinferencetunings: get; pagedinferencetunings/status: patch
- pagedinferenceservices: get, list, create, patch, delete (trials; Auto's apply)
- discovery.k8s.io endpointslices: list (a trial's ready address)
- configmaps: get, create, patch (Manual's recommendation)
"""
from __future__ import annotations

import copy
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from paged_api.contract import API_KEY_FILE_ENV, GROUP, TUNING_LABEL, VERSION
from paged_api.contract import SERVICE_PLURAL as SERVICES
from paged_api.contract import TUNING_PLURAL as TUNINGS
from tuner.measure.runner import Infeasible

MERGE = "application/merge-patch+json"
PORT = 8000   # the engine's port in every PagedInferenceService pod
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def load_client() -> client.ApiClient:
    """In-cluster service account, else $KUBECONFIG (the local cluster gives pods one)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
    return client.ApiClient()


def current_namespace() -> str:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    return NAMESPACE_FILE.read_text().strip() if NAMESPACE_FILE.exists() else "default"


def _api_message(exc: ApiException) -> str:
    """The Status message of an API error (the CRD rule's message is in it)."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)


def _is_ready(obj: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


class Cluster:
    def __init__(self, api: client.ApiClient, namespace: str, tuning: str) -> None:
        self.ns, self.tuning = namespace, tuning
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.discovery = client.DiscoveryV1Api(api)
        self.stopping = threading.Event()   # set on SIGTERM: waits give up at once

    # ---- the tuning resource ----
    def get_tuning(self) -> dict | None:
        return self._get(TUNINGS, self.tuning)

    def write_status(self, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.ns, TUNINGS, self.tuning, {"status": status},
            _content_type=MERGE)

    def owner_ref(self, tuning: dict) -> dict:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PagedInferenceTuning",
                "name": tuning["metadata"]["name"], "uid": tuning["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}

    # ---- services: the target and the trials ----
    def get_service(self, name: str) -> dict | None:
        return self._get(SERVICES, name)

    def _get(self, plural: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def trial_names(self) -> list[str]:
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.ns, SERVICES, label_selector=f"{TUNING_LABEL}={self.tuning}")
        return [item["metadata"]["name"] for item in found.get("items") or []
                if (item["metadata"].get("labels") or {}).get(TUNING_LABEL) == self.tuning]

    def create_trial(self, name: str, target: dict, engine: dict, owner: dict) -> None:
        """The target's spec with `engine` as spec.engine, one replica, no autoscaler or
        router; labelled and owned by the tuning resource (deleting it deletes trials)."""
        spec = copy.deepcopy(target["spec"])
        spec["engine"] = engine
        spec["replicas"] = 1
        for field in ("autoscaling", "router"):
            spec.pop(field, None)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PagedInferenceService",
                "metadata": {"name": name, "namespace": self.ns,
                             "labels": {TUNING_LABEL: self.tuning},
                             "ownerReferences": [owner]},
                "spec": spec}
        self.delete_service(name, wait=True)  # a leftover of an interrupted run
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, SERVICES, body)
        except ApiException as exc:
            # 422 Invalid: the settings break a rule of the CRD (a host KV tier on a target
            # with engine.enablePrefixCaching false): the trial is infeasible, in its words
            if exc.status == 422:
                raise Infeasible(f"{name} refused by the API server: "
                                 f"{_api_message(exc)}") from None
            raise

    def delete_service(self, name: str, *, wait: bool = False, timeout: float = 120) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, SERVICES, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        deadline = time.monotonic() + timeout
        while wait and self.get_service(name) is not None and time.monotonic() < deadline:
            time.sleep(0.3)

    def wait_ready(self, name: str, *, timeout: float, generation: int | None = None) -> dict:
        """Until the service is Ready (at `generation`, with its rollout complete);
        Infeasible with the engine's own message when it is Degraded or never turns
        Ready."""
        deadline = time.monotonic() + timeout
        while not self.stopping.is_set():
            obj = self.get_service(name)
            if obj is None:
                raise Infeasible(f"PagedInferenceService {name} disappeared")
            status = obj.get("status") or {}
            conds = {c.get("type"): c for c in status.get("conditions") or []}
            seen = status.get("observedGeneration") or 0
            caught_up = generation is None or seen >= generation
            if caught_up and _is_ready(obj) and \
                    (conds.get("Progressing") or {}).get("status") != "True":
                return obj
            degraded = conds.get("Degraded") or {}
            if caught_up and degraded.get("status") == "True":
                raise Infeasible(degraded.get("message") or degraded.get("reason") or "Degraded")
            if time.monotonic() > deadline:
                raise Infeasible(f"not Ready within {timeout:.0f} s: "
                                 + ((conds.get("Ready") or {}).get("message") or "no status"))
            time.sleep(0.5)
        raise Infeasible("stopped")

    def endpoint_url(self, service: str, *, timeout: float = 30) -> str:
        """http://ADDRESS:8000 of a ready endpoint of the service's EndpointSlices (one
        pod per trial; the address a cluster's pods reach it at, and what Prometheus
        labels `instance`)."""
        deadline = time.monotonic() + timeout
        while True:
            slices = self.discovery.list_namespaced_endpoint_slice(
                self.ns, label_selector=f"kubernetes.io/service-name={service}")
            for sl in slices.items:
                if (sl.metadata.labels or {}).get("kubernetes.io/service-name") != service:
                    continue
                for ep in sl.endpoints or []:
                    if ep.addresses and (ep.conditions is None or ep.conditions.ready):
                        return f"http://{ep.addresses[0]}:{PORT}"
            if time.monotonic() > deadline:
                raise Infeasible(f"service {service} has no ready endpoint")
            time.sleep(0.3)

    def patch_service(self, name: str, patch: dict) -> dict:
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, SERVICES, name, patch, _content_type=MERGE)

    # ---- the recommendation ----
    def put_config_map(self, name: str, data: dict[str, str], owner: dict) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": self.ns,
                             "labels": {TUNING_LABEL: self.tuning},
                             "ownerReferences": [owner]},
                "data": data}
        try:
            self.core.create_namespaced_config_map(self.ns, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.patch_namespaced_config_map(name, self.ns, {"data": data},
                                                  _content_type=MERGE)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def api_key(ref: dict) -> str:
    """The target's API key from the file the operator mounts ($TUNER_API_KEY_FILE)."""
    where = f"the Secret {ref.get('name')!r} (key {ref.get('key') or 'api-key'!r})"
    path = os.environ.get(API_KEY_FILE_ENV)
    if not path:
        raise ValueError(f"spec.targetRef: the target requires an API key but this Job has "
                         f"none mounted: delete the tuning and apply it again so that the "
                         f"operator mounts {where}")
    try:
        key = Path(path).read_text().strip()
    except OSError:
        key = ""
    if not key:
        raise ValueError(f"spec.targetRef: the target's apiKeySecretRef names {where}, "
                         f"which is missing or empty: create it")
    return key
