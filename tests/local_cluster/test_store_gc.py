"""The API server store's garbage collector (background cascading deletion), without a
cluster: dependents go when none of their owners is left, through chains of owners."""
from __future__ import annotations

import copy

from localcluster.api.kinds import BUILTIN
from localcluster.api.store import Store

CM = next(k for k in BUILTIN if k.plural == "configmaps")


def make(store: Store, name: str, *owners: dict) -> dict:
    refs = [{"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"],
             "uid": o["metadata"]["uid"]} for o in owners]
    return store.create(CM, "default", {"metadata": {"name": name, **(
        {"ownerReferences": refs} if refs else {})}})


def names(store: Store) -> set[str]:
    return {o["metadata"]["name"] for o in store.items(CM)}


def test_dependents_go_with_their_last_owner_through_chains():
    store = Store()
    a, b = make(store, "a"), make(store, "b")
    child = make(store, "child", a)
    make(store, "grandchild", child)
    make(store, "shared", a, b)
    store.delete(CM, "default", "a")
    assert names(store) == {"b", "shared"}   # the chain went; "shared" still has b
    store.delete(CM, "default", "b")
    assert names(store) == set()


def test_a_dependent_whose_owner_is_already_gone_is_collected():
    store = Store()
    a = make(store, "a")
    store.delete(CM, "default", "a")
    make(store, "late", a)
    assert names(store) == set()


def test_changing_owner_references_moves_the_dependent():
    store = Store()
    a, b = make(store, "a"), make(store, "b")
    child = copy.deepcopy(make(store, "child", a))
    child["metadata"]["ownerReferences"][0]["uid"] = b["metadata"]["uid"]
    store.update(CM, child)
    store.delete(CM, "default", "a")
    assert names(store) == {"b", "child"}
    store.delete(CM, "default", "b")
    assert names(store) == set()
