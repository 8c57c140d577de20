"""The API server's object store: resource versions, generations, finalizers, the garbage
collector of dependents, and the watch event history that lets a watch resume from a
resourceVersion (older than the history: 410 Gone, as etcd's compaction would).

All methods are synchronous and run on the server's event loop, so no lock is needed.
"""
from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .kinds import Kind

Key = tuple[str, str, str, str]          # (group, plural, namespace or "", name)
HISTORY = 5000


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Gone(Exception):
    pass


@dataclass
class Event:
    rv: int
    group: str
    plural: str
    type: str
    obj: dict[str, Any]


class Store:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.kinds: dict[tuple[str, str], Kind] = {}    # (group, plural) -> Kind last written
        self._rv = 1
        self._history: collections.deque[Event] = collections.deque(maxlen=HISTORY)
        self._watchers: set[asyncio.Queue[Event]] = set()
        self.hooks: list[Callable[[Event], None]] = []   # in-process observers (kubelet, CRDs)
        self._uids: dict[str, Key] = {}                  # uid -> key of the object
        self._dependents: dict[str, set[Key]] = {}       # owner uid -> keys of its dependents
        self.graceful_pods = False   # set when a kubelet runs the pods (it finishes deletion)

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def _emit(self, kind: Kind, type_: str, obj: dict[str, Any]) -> None:
        event = Event(int(obj["metadata"]["resourceVersion"]), kind.group, kind.plural, type_,
                      copy.deepcopy(obj))
        self._history.append(event)
        for queue in list(self._watchers):
            queue.put_nowait(event)
        for hook in list(self.hooks):
            hook(event)

    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def _put(self, key: Key, obj: dict[str, Any]) -> None:
        """Store `obj` under `key`, keeping the uid and owner indexes of the collector."""
        old = self.objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self.objects[key] = obj
        self._uids[obj["metadata"]["uid"]] = key
        for ref in obj["metadata"].get("ownerReferences") or []:
            self._dependents.setdefault(ref.get("uid"), set()).add(key)

    def _unindex(self, key: Key, obj: dict[str, Any]) -> None:
        self._uids.pop(obj["metadata"].get("uid"), None)
        for ref in obj["metadata"].get("ownerReferences") or []:
            self._dependents.get(ref.get("uid"), set()).discard(key)

    # ---- reads ----
    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind.group, kind.plural, namespace or "", name))

    def items(self, kind: Kind, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        for (g, p, ns, _), obj in list(self.objects.items()):
            if (g, p) == kind.key and (namespace is None or ns == namespace):
                yield obj

    # ---- writes (prepare_*: the object as it would be stored, nothing changed) ----
    def prepare_create(self, kind: Kind, namespace: str | None,
                       obj: dict[str, Any]) -> tuple[Key, dict[str, Any]]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ValueError("metadata.name or metadata.generateName is required")
        key = (kind.group, kind.plural, meta.get("namespace", ""), meta["name"])
        if key in self.objects:
            raise FileExistsError(f'{kind.plural}.{kind.group or "core"} "{meta["name"]}" '
                                  "already exists")
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        for drop in ("deletionTimestamp", "resourceVersion", "managedFields"):
            meta.pop(drop, None)
        return key, obj

    def create(self, kind: Kind, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        key, obj = self.prepare_create(kind, namespace, obj)
        meta = obj["metadata"]
        self._bump(obj)
        self._put(key, obj)
        self.kinds[kind.key] = kind
        self._emit(kind, "ADDED", obj)
        refs = meta.get("ownerReferences") or []
        if refs and not any(r.get("uid") in self._uids for r in refs):
            return self.delete(kind, namespace, meta["name"])   # its owners are gone already
        return obj

    def prepare_update(self, kind: Kind, new: dict[str, Any],
                       ) -> tuple[Key, dict[str, Any], dict[str, Any]]:
        """(key, `new` with the fields the server keeps or sets, the current object)."""
        meta = new["metadata"]
        key = (kind.group, kind.plural, meta.get("namespace", ""), meta["name"])
        old = self.objects[key]
        for fixed in ("uid", "creationTimestamp", "namespace", "name"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
        for kept in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if kept in old["metadata"]:
                meta[kept] = old["metadata"][kept]
        meta["generation"] = old["metadata"].get("generation", 1) + (
            {k: v for k, v in new.items() if k not in ("metadata", "status")}
            != {k: v for k, v in old.items() if k not in ("metadata", "status")})
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        return key, new, old

    def update(self, kind: Kind, new: dict[str, Any]) -> dict[str, Any]:
        """Store `new` (a whole object) over the current one; spec changes bump generation."""
        key, new, old = self.prepare_update(kind, new)
        meta = new["metadata"]
        if new == old:
            return old   # a no-op write changes nothing, as in etcd
        self._bump(new)
        self._put(key, new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") \
                and not self._awaits_kubelet(kind, new):
            self._remove(kind, key)
        else:
            self._emit(kind, "MODIFIED", new)
        return new

    def _awaits_kubelet(self, kind: Kind, obj: dict[str, Any]) -> bool:
        """A pod being deleted gracefully stays until its kubelet has stopped it."""
        return (self.graceful_pods and kind.key == ("", "pods")
                and obj["metadata"].get("deletionGracePeriodSeconds", 0) > 0)

    def delete(self, kind: Kind, namespace: str | None, name: str,
               grace: int | None = None) -> dict[str, Any]:
        key = (kind.group, kind.plural, namespace or "", name)
        obj = self.objects[key]
        meta = obj["metadata"]
        pod = self.graceful_pods and kind.key == ("", "pods")
        if meta.get("deletionTimestamp"):
            if pod and grace == 0 and not meta.get("finalizers"):
                return self._remove(kind, key)
            return obj
        if meta.get("finalizers") or (pod and grace != 0):
            obj = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = now()
            if pod:
                obj["metadata"]["deletionGracePeriodSeconds"] = grace if grace is not None \
                    else obj.get("spec", {}).get("terminationGracePeriodSeconds", 30)
            self._bump(obj)
            self._put(key, obj)
            self._emit(kind, "MODIFIED", obj)
            return obj
        return self._remove(kind, key)

    def _remove(self, kind: Kind, key: Key) -> dict[str, Any]:
        obj = self.objects.pop(key)
        self._unindex(key, obj)
        self._bump(obj)
        self._emit(kind, "DELETED", obj)
        if kind.plural == "namespaces" and not kind.group:
            for other, child in list(self.objects.items()):
                if other[2] == key[3] and other in self.objects:
                    self.delete(self.kinds[other[:2]], other[2], other[3])
        self.collect_garbage(obj["metadata"].get("uid"))
        return obj

    def collect_garbage(self, owner_uid: str | None) -> None:
        """Delete the dependents of a removed owner that have no other owner left
        (background cascading deletion)."""
        for key in sorted(self._dependents.pop(owner_uid, set())):
            obj = self.objects.get(key)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") in self._uids for r in refs):
                self.delete(self.kinds[key[:2]], key[2], key[3])

    # ---- watches ----
    def subscribe(self, since: int | None) -> tuple[list[Event], asyncio.Queue[Event]]:
        """Events after `since` still in the history, and a queue of the ones to come."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        backlog: list[Event] = []
        if since is not None:
            full = len(self._history) == self._history.maxlen
            if full and since + 1 < self._history[0].rv:
                raise Gone(f"too old resource version: {since} ({self._rv})")
            backlog = [e for e in self._history if e.rv > since]
        self._watchers.add(queue)
        return backlog, queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        self._watchers.discard(queue)
