"""What the node's network would do: each Service gets a TCP forwarder on its own loopback
address (127.0.1.N) spreading connections over its ready endpoints, since
*.svc.cluster.local does not resolve on the host; PodMonitors become Prometheus file_sd
targets; DIR/cluster.json lists both for users and tests."""
from __future__ import annotations

import asyncio
import itertools
import json
import os
from pathlib import Path
from typing import Any

from ..api.selectors import match_labels
from ..prometheus import write_targets
from .node import AddressPool
from .probes import resolve_port


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class Forwarder:
    def __init__(self, network: "Network", ns: str, name: str, ip: str) -> None:
        self.network, self.ns, self.name, self.ip = network, ns, name, ip
        self.servers: dict[int, asyncio.Server] = {}
        self.turn = itertools.count()

    def backends(self, port_name: str) -> list[tuple[str, int]]:
        kind = self.network.kubelet.kind("endpointslices")
        eps = self.network.kubelet.api.store.get(kind, self.ns, f"{self.name}-local")
        if eps is None:
            return []
        port = next((p["port"] for p in eps.get("ports") or [] if p.get("name", "") ==
                     port_name), None)
        return [(e["addresses"][0], port) for e in eps.get("endpoints") or []
                if e["conditions"].get("ready") and port is not None]

    async def _serve(self, port_name: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        backends = self.backends(port_name)
        if not backends:
            writer.close()   # as a real Service with no ready endpoints: connection refused-ish
            return
        ip, port = backends[next(self.turn) % len(backends)]
        try:
            up_reader, up_writer = await asyncio.open_connection(ip, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def sync(self, ports: list[dict[str, Any]]) -> None:
        wanted = {int(p["port"]): p.get("name", "") for p in ports}
        for port in set(self.servers) - set(wanted):
            self.servers.pop(port).close()
        for port, name in wanted.items():
            if port not in self.servers:
                self.servers[port] = await asyncio.start_server(
                    lambda r, w, n=name: self._serve(n, r, w), self.ip, port)

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()


class Network:
    def __init__(self, kubelet: Any, cluster_dir: Path, info: dict[str, Any]) -> None:
        self.kubelet, self.dir, self.info = kubelet, cluster_dir, info
        self.ips = AddressPool(1)
        self.forwarders: dict[tuple[str, str], Forwarder] = {}
        self.targets_dir = cluster_dir / "prometheus" / "targets"
        self._written: str = ""
        self._own_targets: set[str] = set()   # files others write there (the tuner's) stay

    def address(self, namespace: str, name: str) -> str:
        """The Service's address (its forwarder's), taken now if the forwarder is not made
        yet: a pod started in the same pass gets it in its Service variables."""
        key = (namespace, name)
        if key not in self.forwarders:
            self.forwarders[key] = Forwarder(self, namespace, name, self.ips.take())
        return self.forwarders[key].ip

    def service_env(self, namespace: str) -> dict[str, str]:
        """Kubernetes' Service variables for a pod of `namespace` (enableServiceLinks):
        NAME_SERVICE_HOST, NAME_SERVICE_PORT (the first port), NAME_SERVICE_PORT_PORTNAME,
        with the local address of each Service there now."""
        env: dict[str, str] = {}
        for svc in self.kubelet.api.store.items(self.kubelet.kind("services")):
            meta, ports = svc["metadata"], svc["spec"].get("ports") or []
            if meta["namespace"] != namespace or meta.get("deletionTimestamp"):
                continue
            prefix = meta["name"].upper().replace("-", "_")
            env[f"{prefix}_SERVICE_HOST"] = self.address(namespace, meta["name"])
            if ports:
                env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
            for port in ports:
                if port.get("name"):
                    env[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = \
                        str(port["port"])
        return env

    async def sync(self) -> None:
        services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in
                    self.kubelet.api.store.items(self.kubelet.kind("services"))}
        for key in set(self.forwarders) - set(services):
            fwd = self.forwarders.pop(key)
            fwd.close()
            self.ips.give_back(fwd.ip)
        for key, svc in services.items():
            self.address(*key)
            try:
                await self.forwarders[key].sync(svc["spec"].get("ports") or [])
            except OSError as e:   # reported, retried on the next pass
                print(f"service {key[0]}/{key[1]}: cannot listen: {e}", flush=True)
        self.write_targets()
        self.write_cluster_json(services)

    def write_targets(self) -> None:
        store, k = self.kubelet.api.store, self.kubelet
        wanted: dict[str, tuple[list[str], dict[str, str]]] = {}
        for mon in store.items(k.kind("podmonitors")):
            ns = mon["metadata"]["namespace"]
            spaces = (mon["spec"].get("namespaceSelector") or {})
            namespaces = None if spaces.get("any") else spaces.get("matchNames") or [ns]
            for pod in store.items(k.kind("pods")):
                pns = pod["metadata"]["namespace"]
                if namespaces is not None and pns not in namespaces:
                    continue
                if not match_labels(mon["spec"].get("selector"), pod["metadata"].get(
                        "labels") or {}) or not (pod.get("status") or {}).get("podIP"):
                    continue
                # as prometheus-operator's PodMonitor: every pod with an address until it
                # is gone, ready or not, terminating included (it may still serve while its
                # preStop hook and drain run); only finished pods are dropped
                if pod["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                for i, ep in enumerate(mon["spec"].get("podMetricsEndpoints") or []):
                    try:
                        port = resolve_port(ep.get("port", 80), pod["spec"]["containers"][0])
                    except ValueError:
                        continue
                    name = f"{pns}_{pod['metadata']['name']}_{i}"
                    wanted[name] = ([f"{pod['status']['podIP']}:{port}"], {
                        "namespace": pns, "pod": pod["metadata"]["name"],
                        "podmonitor": mon["metadata"]["name"],
                        "__metrics_path__": ep.get("path", "/metrics"),
                        **{f"label_{key.replace('.', '_').replace('/', '_').replace('-', '_')}":
                           v for key, v in (pod["metadata"].get("labels") or {}).items()}})
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        for old in self.targets_dir.glob("*.json"):
            if old.stem not in wanted and old.stem in self._own_targets:
                old.unlink()
        self._own_targets = set(wanted)
        for name, (targets, labels) in wanted.items():
            path = self.targets_dir / f"{name}.json"
            text = json.dumps([{"targets": targets, "labels": labels}])
            if not path.exists() or path.read_text() != text:
                write_targets(self.targets_dir, name, targets, labels)

    def write_cluster_json(self, services: dict[tuple[str, str], dict[str, Any]]) -> None:
        listed = {}
        for (ns, name), fwd in sorted(self.forwarders.items()):
            if (ns, name) not in services:   # made while this pass awaited: the next lists it
                continue
            ports = {p.get("name") or str(p["port"]): f"{fwd.ip}:{p['port']}"
                     for p in services[(ns, name)]["spec"].get("ports") or []}
            first = next(iter(ports.values()), None)
            listed[f"{ns}/{name}"] = {"address": fwd.ip, "ports": ports,
                                      **({"url": f"http://{first}"} if first else {})}
        doc = {**self.info, "services": listed}
        text = json.dumps(doc, indent=1)
        if text != self._written:
            tmp = self.dir / "cluster.json.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.dir / "cluster.json")
            self._written = text

    def close(self) -> None:
        for fwd in self.forwarders.values():
            fwd.close()
        self.ips.release_all()
