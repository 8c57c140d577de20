"""A small async Kubernetes API client for the children the operator manages.

kopf watches and patches the custom resources itself but offers no client for other
objects, so this one speaks plain HTTP with the credentials kopf's login handler found
(kopf.ConnectionInfo): GET, POST, merge-PATCH, DELETE and API discovery, nothing more.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
import kopf


@dataclasses.dataclass(frozen=True)
class Kind:
    api_version: str   # "v1", "apps/v1", ...
    plural: str

    @property
    def base(self) -> str:
        return f"/api/{self.api_version}" if "/" not in self.api_version \
            else f"/apis/{self.api_version}"


KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("v1", "configmaps"),
    "Service": Kind("v1", "services"),
    "PersistentVolumeClaim": Kind("v1", "persistentvolumeclaims"),
    "Deployment": Kind("apps/v1", "deployments"),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": Kind("autoscaling/v2", "horizontalpodautoscalers"),
    "ScaledObject": Kind("keda.sh/v1alpha1", "scaledobjects"),
    "PodMonitor": Kind("monitoring.coreos.com/v1", "podmonitors"),
}


class ApiError(Exception):
    """A non-success answer from the API server; `status` is the HTTP code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class KubeApi:
    """One aiohttp session per login; `connect()` again when the credentials change."""

    def __init__(self) -> None:
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self.closed = False  # set for good when the operator shuts down

    async def connect(self, info: kopf.ConnectionInfo) -> None:
        await self.close()
        ssl: Any = info.as_ssl_context() if info.server.startswith("https") else None
        self._info = info
        self._session = aiohttp.ClientSession(
            headers={**info.as_http_headers(), "Accept": "application/json"},
            connector=aiohttp.TCPConnector(ssl=ssl) if ssl else aiohttp.TCPConnector(),
            timeout=aiohttp.ClientTimeout(total=30),
            trust_env=info.trust_env)

    async def close(self, *, final: bool = False) -> None:
        self.closed = self.closed or final
        if self._session is not None:
            await self._session.close()
        self._session = None

    async def _request(self, method: str, path: str, *, body: Any = None,
                       content_type: str = "application/json") -> tuple[int, Any]:
        if self.closed:
            raise kopf.TemporaryError("the operator is shutting down", delay=60)
        if self._session is None or self._info is None:
            raise kopf.TemporaryError("not logged in to the API server yet", delay=1)
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self._session.request(method, self._info.server.rstrip("/") + path,
                                         data=data, headers=headers) as resp:
            text = await resp.text()
            try:
                payload = json.loads(text) if text else None
            except ValueError:
                payload = None
            if resp.status >= 400 and resp.status not in (404, 409):
                message = payload.get("message") if isinstance(payload, dict) else text
                raise ApiError(resp.status, f"{method} {path}: {message or resp.reason}")
            return resp.status, payload

    @staticmethod
    def path(kind: Kind, namespace: str, name: str | None = None,
             subresource: str | None = None) -> str:
        parts = [kind.base, "namespaces", namespace, kind.plural, name, subresource]
        return "/".join(p for p in parts if p)

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        status, payload = await self._request("GET", self.path(kind, namespace, name))
        return None if status == 404 else payload

    async def create(self, kind: Kind, namespace: str,
                     body: dict[str, Any]) -> dict[str, Any] | None:
        """POST; None when an object of that name already exists (409)."""
        status, payload = await self._request("POST", self.path(kind, namespace), body=body)
        return None if status == 409 else payload

    async def patch(self, kind: Kind, namespace: str, name: str, patch: dict[str, Any], *,
                    subresource: str | None = None) -> dict[str, Any] | None:
        """JSON merge patch (RFC 7386): lists are replaced whole, None removes a key."""
        status, payload = await self._request(
            "PATCH", self.path(kind, namespace, name, subresource), body=patch,
            content_type="application/merge-patch+json")
        return None if status == 404 else payload

    async def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        status, _ = await self._request("DELETE", self.path(kind, namespace, name))
        return status != 404

    async def has_resource(self, kind: Kind) -> bool:
        """Whether the cluster serves this kind (e.g. PodMonitor once its CRD is installed)."""
        status, payload = await self._request("GET", kind.base)
        if status == 404 or not isinstance(payload, dict):
            return False
        return any(r.get("name") == kind.plural for r in payload.get("resources", []))
