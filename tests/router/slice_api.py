"""kmock's KubernetesEmulator serving EndpointSlices over real HTTP, with a kubeconfig for
it in $KUBECONFIG, so the router's discovery talks to it through the official client."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import kmock

SLICES = "discovery.k8s.io/v1/endpointslices"


@contextlib.asynccontextmanager
async def endpoint_slice_api(tmp_path: Any, monkeypatch: Any) -> AsyncIterator[Any]:
    """Yields the kmock server (its `.client` writes slices, its `.url` serves them)."""
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources[SLICES] = kmock.ResourceInfo(
            kind="EndpointSlice", namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"})
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
            f"clusters: [{{name: t, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: t, user: {token: t}}]\n"
            "contexts: [{name: t, context: {cluster: t, user: t}}]\n")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        yield server
