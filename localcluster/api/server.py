"""The emulated API server: kmock's KubernetesEmulator with its request handling replaced
by one faithful enough for kubectl 1.35, kopf and the `kubernetes` client.

kmock still parses requests and runs the HTTP server; `_handle` serves every request from
our Store: discovery (core group version "v1", singular names, short names), LIST with
`kind` and selectors, watches as JSON lines resumable by resourceVersion, Tables for
`kubectl get`, PUT/PATCH (merge, JSON and strategic), generateName, the status and scale
subresources, pods/log from the kubelet's log files, and CRDs served once created. Bodies
and answers are JSON or, for built-in kinds, protobuf (negotiate.py; counted on /metrics).
"""
from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any, Callable

import aiohttp.web
import kmock
import multidict

from . import dry_run, negotiate, protobuf_encode, selectors, tables, writes
from .kinds import Catalog, Kind, kinds_of_crd
from .store import Event, Gone, Store
from .writes import ApiError

LogSource = Callable[[str, str, str | None, bool], Path | None]
VERSION = {"major": "1", "minor": "35", "gitVersion": "v1.35.0-paged-localcluster",
           "platform": "linux/amd64"}


def _status(code: int, reason: str, message: str,
            details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "code": code, "reason": reason, "message": message,
            **({"details": details} if details else {})}


class ApiServer(kmock.KubernetesEmulator):
    store: Store
    catalog: Catalog
    log_source: LogSource | None

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store, self.catalog, self.log_source = Store(), Catalog(), None
        self.responder = negotiate.Responder()   # JSON or protobuf, counted
        self.store.hooks.append(self._on_event)
        for ns in ("default", "kube-system"):
            writes.create(self.store, self.catalog.find("", "v1", "namespaces"), None,
                          {"metadata": {"name": ns}})

    def _on_event(self, event: Event) -> None:
        if (event.group, event.plural) == ("apiextensions.k8s.io", "customresourcedefinitions"):
            spec = event.obj.get("spec", {})
            self.catalog.remove_group_plural(spec.get("group"), spec.get("names", {}).get("plural"))
            if event.type != "DELETED":
                self.catalog.add(kinds_of_crd(event.obj))

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's own request parser fails on some core paths (/api/v1/namespaces): build
        # the request here, keep only the recent ones (a long-running server), then serve.
        body = await raw.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        request = kmock.Request(method=raw.method, url=raw.url, params=dict(raw.query),
                                headers=dict(raw.headers), body=body, data=data,
                                raw_request=raw)
        self._requests.append(request)
        del self._requests[:-50]
        return await self._handle(request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        error = functools.partial(self.responder.error, raw.headers.get("Accept"))
        try:
            return await self._route(raw, request)
        except ApiError as e:
            return error(_status(e.code, e.reason, e.message, e.details), e.code)
        except ValueError as e:
            return error(_status(400, "BadRequest", str(e)), 400)
        except Exception as e:   # a bug here: answer as a real server would, with a Status
            return error(_status(500, "InternalError", repr(e)), 500)

    async def _route(self, raw: Any, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = raw.path.rstrip("/") or "/"
        parts = path.strip("/").split("/")
        json_ = aiohttp.web.json_response
        if path in ("/healthz", "/livez", "/readyz"):
            return aiohttp.web.Response(text="ok")
        if path == "/version":
            return json_(VERSION)
        if path == "/metrics":
            return self.responder.metrics()
        if path == "/api":
            return json_({"kind": "APIVersions", "versions": ["v1"],
                          "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                          "serverAddress": raw.host}]})
        if path == "/apis":
            return json_(self.catalog.api_group_list())
        if path == "/openapi/v3":
            return json_({"paths": {}})
        if path == "/openapi/v2":
            # An empty OpenAPI document (an all-default protobuf message is zero bytes): no
            # schema is published, so kubectl's client-side validation finds no type to check.
            return aiohttp.web.Response(body=b"", headers={
                "Content-Type": "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"})
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 2:
            if len(parts) == 2:
                doc = self.catalog.api_group(parts[1])
                if doc is None:
                    raise ApiError(404, "NotFound", f"group {parts[1]} is not served")
                return json_(doc)
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find {path}")
        if not rest:
            doc = self.catalog.resource_list(group, version)
            if doc is None:
                raise ApiError(404, "NotFound", f"{group}/{version} is not served")
            return json_(doc)
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (
                len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        kind = self.catalog.find(group, version, rest[0])
        if kind is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested "
                           f"resource {group}/{version}/{rest[0]}")
        name = rest[1] if len(rest) > 1 else None
        sub = "/".join(rest[2:]) or None
        return await self._serve(raw, request, kind, namespace, name, sub)

    async def _serve(self, raw: Any, request: kmock.Request, kind: Kind, namespace: str | None,
                     name: str | None, sub: str | None) -> aiohttp.web.StreamResponse:
        method, query, store = raw.method, raw.query, self.store
        data = negotiate.request_data(raw.content_type, method, request.body, request.data)
        if method in ("POST", "PUT", "PATCH", "DELETE"):   # dryRun=All: admitted, not stored
            store = dry_run.store_for(store, query, data if method == "DELETE" else None)
        warnings: list[str] = []
        validation = query.get("fieldValidation") or "Warn"

        def json_(body: Any, status: int = 200) -> aiohttp.web.Response:
            # each unknown field dropped under fieldValidation=Warn: a Warning header
            headers = multidict.CIMultiDict(
                ("Warning", "299 - " + json.dumps(w)) for w in warnings)
            return self.responder.answer(raw.headers.get("Accept"), body, status, headers)

        if sub is not None and sub not in kind.subresources:
            raise ApiError(404, "NotFound", f"{kind.plural} has no subresource {sub}")
        if method == "GET" and query.get("watch") in ("true", "1"):
            return await self._watch(raw, kind, namespace, name)
        if name is None:
            if method == "GET":
                return json_(self._list(raw, kind, namespace))
            if method == "POST":
                return json_(writes.create(store, kind, namespace, data, validation,
                                           warnings), status=201)
            if method == "DELETE":
                items = self._select(raw, kind, namespace)
                for obj in items:
                    writes.delete(store, kind, namespace, obj["metadata"]["name"], {})
                return json_({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                              "metadata": {}, "items": items})
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
        if sub == "log":
            return await self._log(raw, namespace or "", name)
        if method == "GET":
            obj = writes._current(store, kind, namespace, name)
            if sub == "scale":
                return json_(writes.scale_of(kind, obj))
            if sub is None and "as=Table" in raw.headers.get("Accept", ""):
                # `kubectl get KIND NAME` asks for a Table too: the printer columns
                return json_(tables.table(kind, [obj], obj["metadata"]["resourceVersion"],
                                          query.get("includeObject", "Metadata")))
            return json_(obj)
        if method == "PUT":
            return json_(writes.replace(store, kind, namespace, name, data, sub,
                                        validation, warnings))
        if method == "PATCH":
            return json_(writes.apply_patch(store, kind, namespace, name, request.body,
                                            raw.content_type or "", sub, validation, warnings))
        if method == "DELETE":
            options = data if isinstance(data, dict) else {}
            if "gracePeriodSeconds" in query:
                options = {**options, "gracePeriodSeconds": int(query["gracePeriodSeconds"])}
            return json_(writes.delete(store, kind, namespace, name, options))
        raise ApiError(405, "MethodNotAllowed", f"{method} on an object")

    def _select(self, raw: Any, kind: Kind, namespace: str | None) -> list[dict[str, Any]]:
        labels = selectors.label_selector(raw.query.get("labelSelector"))
        fields = selectors.field_selector(raw.query.get("fieldSelector"))
        objs = [o for o in self.store.items(kind, namespace) if labels(o) and fields(o)]
        return sorted(objs, key=lambda o: (o["metadata"].get("namespace", ""),
                                           o["metadata"]["name"]))

    def _list(self, raw: Any, kind: Kind, namespace: str | None) -> dict[str, Any]:
        items = self._select(raw, kind, namespace)
        rv = self.store.resource_version
        if "as=Table" in raw.headers.get("Accept", ""):
            return tables.table(kind, items, rv, raw.query.get("includeObject", "Metadata"))
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": rv}, "items": items}

    async def _watch(self, raw: Any, kind: Kind, namespace: str | None,
                     name: str | None) -> aiohttp.web.StreamResponse:
        labels = selectors.label_selector(raw.query.get("labelSelector"))
        fields = selectors.field_selector(raw.query.get("fieldSelector"))
        rv = raw.query.get("resourceVersion")
        initial = raw.query.get("sendInitialEvents") == "true"   # a "watch list" request
        since = int(rv) if rv and rv != "0" and rv.isdigit() and not initial else None
        table = "as=Table" in raw.headers.get("Accept", "")
        # protobuf frames for a built-in kind when preferred (406 for a CR if nothing else)
        proto = not table and negotiate.wants_protobuf(raw.headers.get("Accept"), {
            "apiVersion": kind.api_version, "kind": kind.kind})

        def wanted(e: Event) -> bool:
            meta = e.obj["metadata"]
            return ((e.group, e.plural) == kind.key and
                    (namespace is None or meta.get("namespace") == namespace) and
                    (name is None or meta["name"] == name) and labels(e.obj) and fields(e.obj))

        def encode(type_: str, obj: dict[str, Any]) -> bytes:
            if proto:
                return protobuf_encode.watch_frame(type_, obj)
            if table and type_ in ("ADDED", "MODIFIED", "DELETED"):
                obj = tables.table(kind, [obj], obj["metadata"]["resourceVersion"])
            return json.dumps({"type": type_, "object": obj}).encode() + b"\n"

        content_type = negotiate.WATCH_PROTOBUF if proto else negotiate.JSON
        self.responder.counts[content_type] += 1
        response = aiohttp.web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(raw)
        try:
            backlog, queue = self.store.subscribe(since)
        except Gone as e:
            await response.write(encode("ERROR", _status(410, "Expired", str(e))))
            return response
        try:
            if since is None:
                for obj in self._select(raw, kind, namespace):
                    if name is None or obj["metadata"]["name"] == name:
                        await response.write(encode("ADDED", obj))
            for event in backlog:
                if wanted(event):
                    await response.write(encode(event.type, event.obj))
            if initial:
                mark = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {
                    "resourceVersion": self.store.resource_version,
                    "annotations": {"k8s.io/initial-events-end": "true"}}}
                await response.write(encode("BOOKMARK", mark))
            timeout = float(raw.query.get("timeoutSeconds") or 1800)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=min(left, 5))
                except asyncio.TimeoutError:
                    if raw.transport is None or raw.transport.is_closing():
                        break
                    continue
                if wanted(event):
                    await response.write(encode(event.type, event.obj))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.unsubscribe(queue)
        return response

    async def _log(self, raw: Any, namespace: str, name: str) -> aiohttp.web.StreamResponse:
        pod = writes._current(self.store, self.catalog.find("", "v1", "pods"), namespace, name)
        container = raw.query.get("container") or pod["spec"]["containers"][0]["name"]
        previous = raw.query.get("previous") in ("true", "1")
        path = self.log_source(namespace, name, container, previous) if self.log_source else None
        if path is None or not path.exists():
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is '
                           "waiting to start" + (": no previous run" if previous else ""))
        data = path.read_bytes()
        if tail := raw.query.get("tailLines"):
            data = b"".join(data.splitlines(keepends=True)[-int(tail):])
        if raw.query.get("follow") not in ("true", "1"):
            return aiohttp.web.Response(body=data, content_type="text/plain")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(raw)
        await response.write(data)
        offset = path.stat().st_size
        try:
            while self.store.get(self.catalog.find("", "v1", "pods"), namespace, name):
                await asyncio.sleep(0.2)
                if path.exists() and path.stat().st_size > offset:
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    offset += len(chunk)
                    await response.write(chunk)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response
