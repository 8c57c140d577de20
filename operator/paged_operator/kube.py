"""The operator's API calls for everything kopf does not watch itself, through the official
`kubernetes` client: typed APIs for built-in kinds (AppsV1Api, CoreV1Api, ...) and
CustomObjectsApi for custom ones (KEDA, prometheus-operator, our own status).

The client is synchronous; each call runs on a small thread pool of its own, so the
event loop that kopf shares among all resources never blocks on the network. Answers are
read as raw JSON (`_preload_content=False`): the reconciler compares plain dicts, and
fields a client model does not know are kept.

Patches are JSON merge patches (RFC 7386), not server-side apply: see operator/README.md
("Why merge patch").
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import kopf
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"
POOL_SIZE = 16  # threads, and as many pooled HTTP connections


@dataclasses.dataclass(frozen=True)
class Kind:
    api_version: str   # "v1", "apps/v1", ...
    plural: str
    # (client API class, method suffix) for built-in kinds; None: CustomObjectsApi.
    typed: tuple[str, str] | None = None

    @property
    def group_version(self) -> tuple[str, str]:
        group, _, version = self.api_version.rpartition("/")
        return group, version


KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("v1", "configmaps", ("CoreV1Api", "config_map")),
    "Service": Kind("v1", "services", ("CoreV1Api", "service")),
    "ServiceAccount": Kind("v1", "serviceaccounts", ("CoreV1Api", "service_account")),
    "PersistentVolumeClaim": Kind("v1", "persistentvolumeclaims",
                                  ("CoreV1Api", "persistent_volume_claim")),
    "Pod": Kind("v1", "pods", ("CoreV1Api", "pod")),
    "Deployment": Kind("apps/v1", "deployments", ("AppsV1Api", "deployment")),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets",
                                ("PolicyV1Api", "pod_disruption_budget")),
    "HorizontalPodAutoscaler": Kind("autoscaling/v2", "horizontalpodautoscalers",
                                    ("AutoscalingV2Api", "horizontal_pod_autoscaler")),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies",
                          ("NetworkingV1Api", "network_policy")),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles",
                 ("RbacAuthorizationV1Api", "role")),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings",
                        ("RbacAuthorizationV1Api", "role_binding")),
    "ScaledObject": Kind("keda.sh/v1alpha1", "scaledobjects"),
    "PodMonitor": Kind("monitoring.coreos.com/v1", "podmonitors"),
}


def request_timeout() -> float:
    """Seconds one API call may take: 30, or $PAGED_OPERATOR_API_TIMEOUT_SECONDS."""
    raw = os.environ.get("PAGED_OPERATOR_API_TIMEOUT_SECONDS")
    try:
        value = float(raw) if raw else 30.0
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"PAGED_OPERATOR_API_TIMEOUT_SECONDS must be a number of seconds > 0, "
                         f"got {raw!r}")
    return value


class ApiError(Exception):
    """A non-success answer from the API server; `status` is the HTTP code (0: no answer,
    the call timed out or the connection failed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def load_configuration() -> client.Configuration:
    """In-cluster service account, else $KUBECONFIG (read now, not at import) or ~/.kube."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        try:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                    client_configuration=cfg)
        except (config.ConfigException, OSError) as exc:
            raise kopf.LoginError("No credentials: run in a pod with a service account, "
                                  f"or set KUBECONFIG ({exc})") from exc
    cfg.connection_pool_maxsize = POOL_SIZE
    return cfg


def connection_info(cfg: client.Configuration, *, trust_env: bool) -> kopf.ConnectionInfo:
    """The same credentials for kopf's own watches (as kopf.login_via_client derives them)."""
    header = cfg.get_api_key_with_prefix("BearerToken") or \
        cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else \
        (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        username=cfg.username or None, password=cfg.password or None,
        scheme=scheme, token=token, certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file, trust_env=trust_env)


class KubeApi:
    """One official ApiClient per login; `connect()` again when the credentials change."""

    def __init__(self) -> None:
        self._client: client.ApiClient | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=POOL_SIZE, thread_name_prefix="kube-api")
        self.closed = False  # set for good when the operator shuts down

    async def connect(self, cfg: client.Configuration) -> None:
        await self.close()
        self._client = client.ApiClient(cfg)

    async def close(self, *, final: bool = False) -> None:
        self.closed = self.closed or final
        old, self._client = self._client, None
        if old is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, old.close)
        if final:
            self._executor.shutdown(wait=False)

    def _api(self, name: str) -> Any:
        if self.closed:
            raise kopf.TemporaryError("the operator is shutting down", delay=60)
        if self._client is None:
            raise kopf.TemporaryError("not logged in to the API server yet", delay=1)
        return getattr(client, name)(self._client)

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any,
                    ) -> dict[str, Any] | None:
        """Run one client call on the pool; the raw JSON answer, or None for 404/409."""
        call = functools.partial(method, *args, _preload_content=False,
                                 _request_timeout=request_timeout(), **kwargs)
        try:
            response = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except urllib3.exceptions.HTTPError as exc:  # timed out, connection refused/reset
            raise ApiError(0, f"{method.__name__}: {exc}") from None
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            try:
                message = json.loads(exc.body or "{}").get("message") or exc.reason
            except (ValueError, AttributeError):
                message = exc.body or exc.reason
            raise ApiError(exc.status or 0, f"{method.__name__}: {message}") from None
        data = response.data
        return json.loads(data) if data else {}

    def _method(self, kind: Kind, verb: str, subresource: str | None = None,
                ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The client method for `verb` on `kind`, and the leading arguments it takes."""
        status = "_status" if subresource == "status" else ""
        if kind.typed is not None:
            api_class, suffix = kind.typed
            return getattr(self._api(api_class), f"{verb}_namespaced_{suffix}{status}"), ()
        group, version = kind.group_version
        method = {"read": "get"}.get(verb, verb)
        return (getattr(self._api("CustomObjectsApi"),
                        f"{method}_namespaced_custom_object{status}"), (group, version))

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        method, lead = self._method(kind, "read")
        if kind.typed:
            return await self._call(method, name, namespace)
        return await self._call(method, *lead, namespace, kind.plural, name)

    async def create(self, kind: Kind, namespace: str,
                     body: dict[str, Any]) -> dict[str, Any] | None:
        """POST; None when an object of that name already exists (409)."""
        method, lead = self._method(kind, "create")
        if kind.typed:
            return await self._call(method, namespace, body)
        return await self._call(method, *lead, namespace, kind.plural, body)

    async def patch(self, kind: Kind, namespace: str, name: str, patch: dict[str, Any], *,
                    subresource: str | None = None) -> dict[str, Any] | None:
        """JSON merge patch (RFC 7386): lists are replaced whole, None removes a key."""
        method, lead = self._method(kind, "patch", subresource)
        if kind.typed:
            return await self._call(method, name, namespace, patch, _content_type=MERGE_PATCH)
        return await self._call(method, *lead, namespace, kind.plural, name, patch,
                                _content_type=MERGE_PATCH)

    async def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        method, lead = self._method(kind, "delete")
        if kind.typed:
            return await self._call(method, name, namespace) is not None
        return await self._call(method, *lead, namespace, kind.plural, name) is not None

    async def list(self, kind: Kind, namespace: str, *,
                   labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Objects of `kind` carrying all `labels` (also checked here, whatever the server
        made of the selector)."""
        method, lead = self._method(kind, "list")
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        if kind.typed:
            found = await self._call(method, namespace, label_selector=selector)
        else:
            found = await self._call(method, *lead, namespace, kind.plural,
                                     label_selector=selector)
        items = (found or {}).get("items") or []
        return [item for item in items if all(
            (item.get("metadata", {}).get("labels") or {}).get(k) == v
            for k, v in labels.items())]

    async def has_resource(self, kind: Kind) -> bool:
        """Whether the cluster serves this kind (e.g. PodMonitor once its CRD is installed)."""
        group, version = kind.group_version
        if not group:
            return True  # the core API is always served
        found = await self._call(self._api("CustomObjectsApi").get_api_resources,
                                 group, version)
        return any(r.get("name") == kind.plural for r in (found or {}).get("resources", []))
