"""`dryRun=All` on a write (kubectl's `--dry-run=server`): the request goes through
everything a real write does (decoding, defaults, admission with the CRD's schema and CEL
rules, conflicts, patches) and answers the object as it would be stored, but nothing is
stored, no resourceVersion is taken and no watch sees an event.

`DryRunStore` stands in for the Store in the write functions (writes.py): reads go to the
real store, writes stop after the Store's own `prepare_*` step.
"""
from __future__ import annotations

import copy
from typing import Any, Iterator

from .kinds import Kind
from .store import Store, now
from .writes import ApiError

SUPPORTED = ("All",)


def store_for(store: Store, query: Any, delete_options: Any = None) -> Any:
    """The store a write goes to: the real one, or a dry run when the query string (or, for
    a DELETE, the DeleteOptions body, where kubectl puts it) asks for one."""
    values = list(query.getall("dryRun", []) if hasattr(query, "getall") else
                  [query["dryRun"]] if "dryRun" in query else [])
    if isinstance(delete_options, dict):
        values += list(delete_options.get("dryRun") or [])
    if not values:
        return store
    bad = [v for v in values if v not in SUPPORTED]
    if bad:
        raise ApiError(400, "BadRequest", f'dryRun: Unsupported value: "{bad[0]}": '
                       'supported values: "All"')
    return DryRunStore(store)


class DryRunStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.store.get(kind, namespace, name)

    def items(self, kind: Kind, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        return self.store.items(kind, namespace)

    def create(self, kind: Kind, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store.prepare_create(kind, namespace, obj)[1]

    def update(self, kind: Kind, new: dict[str, Any]) -> dict[str, Any]:
        _, new, old = self.store.prepare_update(kind, new)
        return old if new == old else new

    def delete(self, kind: Kind, namespace: str | None, name: str,
               grace: int | None = None) -> dict[str, Any]:
        """What a delete answers: the object, marked for deletion if finalizers hold it."""
        obj = copy.deepcopy(self.store.objects[(kind.group, kind.plural, namespace or "",
                                                name)])
        meta = obj["metadata"]
        if meta.get("finalizers") and not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now()
        return obj
