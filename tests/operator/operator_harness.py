"""The real operator (kopf.operator) against kmock's KubernetesEmulator over real HTTP.

`Cluster` adds to the emulator the few API-server behaviours the operator relies on and
the emulator leaves to "inherit and implement": server-assigned metadata (uid,
generation, resourceVersion, creationTimestamp), the status subresource split, and the
garbage collector that deletes dependents whose owners are gone (kube-controller-manager's
job in a real cluster).
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import kopf
import paged_operator  # noqa: F401  (registers the handlers in kopf's default registry)

PIS = "serving.pagedinference.dev/v1alpha1/pagedinferenceservices"
DEPLOYMENTS = "apps/v1/deployments"
NAMESPACE = "llm"
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
RESOURCES = {
    PIS: dict(kind="PagedInferenceService", shortnames={"pis"}, subresources={"status", "scale"}),
    DEPLOYMENTS: dict(kind="Deployment", subresources={"status", "scale"}),
    "v1/services": dict(kind="Service", subresources={"status"}),
    "v1/configmaps": dict(kind="ConfigMap"),
    "v1/persistentvolumeclaims": dict(kind="PersistentVolumeClaim", subresources={"status"}),
    "v1/events": dict(kind="Event"),
    # Present in every cluster; kopf's discovery waits for them before it starts watching.
    "v1/namespaces": dict(kind="Namespace", namespaced=False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(kind="CustomResourceDefinition",
                                                             namespaced=False),
    "policy/v1/poddisruptionbudgets": dict(kind="PodDisruptionBudget", subresources={"status"}),
    "autoscaling/v2/horizontalpodautoscalers": dict(kind="HorizontalPodAutoscaler",
                                                    subresources={"status"}),
    "v1/pods": dict(kind="Pod", subresources={"status"}),
    "v1/serviceaccounts": dict(kind="ServiceAccount"),
    "networking.k8s.io/v1/networkpolicies": dict(kind="NetworkPolicy"),
    "rbac.authorization.k8s.io/v1/roles": dict(kind="Role"),
    "rbac.authorization.k8s.io/v1/rolebindings": dict(kind="RoleBinding"),
}
PODMONITORS = "monitoring.coreos.com/v1/podmonitors"


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class Cluster(kmock.KubernetesEmulator):
    _versions = itertools.count(1)

    def declare(self, resource: str, kind: str, namespaced: bool = True, **info: Any) -> None:
        self.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=namespaced,
                                                      verbs=VERBS, **info)

    def live(self, resource: str) -> dict[tuple[str | None, str], dict[str, Any]]:
        """{(namespace, name): raw object} of the objects of one resource not deleted."""
        res = kmock.resource(resource)
        return {(ns, name): obj.raw for (r, ns, name), obj in list(self.objects.items())
                if r == res and not obj.deleted}

    def count(self, method: str, resource: str | None = None, *,
              subresource: str | None = None) -> int:
        """How many requests of an HTTP method went to a resource (iterating yields them)."""
        res = kmock.resource(resource) if resource else None
        return sum(1 for r in list(self) if r.method.value == method.upper()
                   and r.resource is not None and (res is None or r.resource == res)
                   and r.subresource == subresource)

    async def _handle(self, request: kmock.Request) -> Any:
        self._stamp(request)
        try:
            return await super()._handle(request)
        finally:
            if request.action in (kmock.action.DELETE, kmock.action.UPDATE):
                await self._collect_garbage()

    def _stamp(self, request: kmock.Request) -> None:
        data = request.data
        if request.resource is None or not isinstance(data, dict):
            return
        version = str(next(self._versions))
        if request.action == kmock.action.CREATE:
            meta = data.setdefault("metadata", {})
            meta.update(uid=str(uuid.uuid4()), generation=1, resourceVersion=version,
                        creationTimestamp=datetime.datetime.now(datetime.timezone.utc)
                        .strftime("%Y-%m-%dT%H:%M:%SZ"))
        elif request.action == kmock.action.UPDATE:
            info = self.resources[request.resource] if request.resource in self.resources \
                else None
            if request.subresource == "status":   # /status changes status only
                for key in [k for k in data if k != "status"]:
                    del data[key]
            elif info is not None and "status" in info.subresources:
                data.pop("status", None)          # ...and the main endpoint never does
            key = (request.resource, request.namespace, request.name)
            current = self.objects[key].raw if key in self.objects \
                and not self.objects[key].deleted else {}
            meta = data.setdefault("metadata", {})
            meta["resourceVersion"] = version
            old_spec = current.get("spec", {})
            if "spec" in data and _merge(old_spec, data["spec"]) != old_spec:
                meta["generation"] = current.get("metadata", {}).get("generation", 1) + 1

    async def _collect_garbage(self) -> None:
        async with self._lock:
            while True:
                live = [(key, obj) for key, obj in self.objects.items() if not obj.deleted]
                uids = {obj.raw.get("metadata", {}).get("uid") for _, obj in live}
                orphans = [(key, obj) for key, obj in live
                           if (refs := obj.raw.get("metadata", {}).get("ownerReferences"))
                           and not any(ref.get("uid") in uids for ref in refs)]
                if not orphans:
                    return
                for key, obj in orphans:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})


class Operator:
    """Runs the real operator in its own thread and event loop, as `kopf run` would.

    kopf.operator() cancels every task that appears in its loop after it starts, so it
    cannot share the test's loop (where the emulator serves); it talks to it over HTTP.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None

    def _main(self, ready: threading.Event) -> None:
        settings = kopf.OperatorSettings()
        settings.watching.reconnect_backoff = 0.1
        settings.batching.batch_window = 0.01
        settings.batching.exit_timeout = 2
        try:
            asyncio.run(kopf.operator(clusterwide=True, standalone=True, settings=settings,
                                      stop_flag=self._stop, ready_flag=ready))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    async def start(self) -> None:
        assert self._thread is None, "already running"
        ready = threading.Event()
        self._stop.clear()
        self._thread = threading.Thread(target=self._main, args=(ready,), daemon=True,
                                        name="operator")
        self._thread.start()
        # Wait off the loop: the emulator in this loop must keep serving meanwhile.
        if not await asyncio.to_thread(ready.wait, 10):
            raise AssertionError(f"the operator did not get ready in 10 s: {self.error!r}")

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 15)
        alive, self._thread = self._thread.is_alive(), None
        assert not alive, "the operator did not stop within 15 s"
        if self.error is not None:
            raise AssertionError("the operator failed") from self.error


@contextlib.asynccontextmanager
async def emulated(emulator_class: type[Cluster], tmp_path: Path,
                   monkeypatch: Any) -> AsyncIterator[Cluster]:
    """An emulated API server over HTTP with the operator's resources declared, a KUBECONFIG
    pointing at it and the operator's fast test timings; `.client` is an HTTP client for the
    test's own API calls."""
    async with emulator_class() as emulator, kmock.Server(emulator) as server:
        for resource, info in RESOURCES.items():
            emulator.declare(resource, **info)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
            f"clusters: [{{name: test, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: test, user: {token: test-token}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: test}}]\n")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("PAGED_OPERATOR_RESYNC_SECONDS", "0.3")
        monkeypatch.setenv("PAGED_OPERATOR_DISCOVERY_TTL_SECONDS", "0.2")
        emulator.client = server.client
        yield emulator


async def eventually(check: Callable[[], Any], *, timeout: float = 10.0,
                     message: str = "condition") -> Any:
    """Poll `check` until it returns something truthy (or stops raising AssertionError)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
            error: str = f"{message}: got {result!r}"
        except (AssertionError, KeyError) as exc:
            error = f"{message}: {exc!r}"
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {error}")
        await asyncio.sleep(0.05)


def pis_body(name: str, spec: dict[str, Any], *, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceService",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def api_path(resource: str, name: str | None = None, *, namespace: str = NAMESPACE,
             subresource: str | None = None) -> str:
    group_version, plural = resource.rsplit("/", 1)
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    return "/".join(p for p in (base, "namespaces", namespace, plural, name, subresource) if p)


async def call(cluster: Cluster, method: str, path: str, body: Any = None) -> Any:
    """An API call by 'a user' (kubectl), over HTTP like the operator's own."""
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with cluster.client.request(method, path, json=body, headers=headers) as resp:
        assert resp.status < 300, f"{method} {path}: {resp.status} {await resp.text()}"
        return await resp.json()


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    conds = obj.get("status", {}).get("conditions") or []
    found = [c for c in conds if c["type"] == type_]
    assert found, f"no {type_} condition in {conds}"
    return found[0]


ROOT = Path(__file__).resolve().parents[2]


async def kubectl(cluster: Cluster, *args: str) -> str:
    """Run the real kubectl against the emulator (KUBECONFIG points at it); returns stdout."""
    binary = shutil.which("kubectl") or str(ROOT / "bin" / "kubectl")
    assert os.access(binary, os.X_OK), "kubectl missing: run scripts/install-k8s-tools.sh"
    proc = await asyncio.create_subprocess_exec(
        binary, "--namespace", NAMESPACE, *args, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()
