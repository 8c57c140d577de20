"""The emulated API server's patch, selector and printer-column semantics, without a cluster."""
from __future__ import annotations

import pytest

from paged_localcluster.api.patch import json_patch, merge_patch, strategic_merge
from paged_localcluster.api.selectors import field_selector, label_selector, match_labels
from paged_localcluster.api.tables import jsonpath
from paged_localcluster.kubelet.launch import rebind

POD_SPEC = {"containers": [{"name": "a", "image": "x:1", "env": [{"name": "A", "value": "1"}],
                            "ports": [{"containerPort": 80}]},
                           {"name": "b", "image": "y:1"}]}


def test_strategic_merge_merges_named_lists_and_honours_directives() -> None:
    patch = {"containers": [{"name": "a", "env": [{"name": "A", "value": "2"}]},
                            {"name": "b", "$patch": "delete"}],
             "$setElementOrder/containers": [{"name": "a"}]}
    out = strategic_merge(POD_SPEC, patch)
    assert out == {"containers": [{"name": "a", "image": "x:1",
                                   "env": [{"name": "A", "value": "2"}],
                                   "ports": [{"containerPort": 80}]}]}


def test_merge_and_json_patch() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}
    doc = json_patch({"spec": {"l": [1, 2]}}, [{"op": "add", "path": "/spec/l/-", "value": 3},
                                              {"op": "replace", "path": "/spec/x", "value": 0}])
    assert doc == {"spec": {"l": [1, 2, 3], "x": 0}}


def test_selectors() -> None:
    obj = {"metadata": {"name": "n", "labels": {"app": "x", "tier": "web"}}}
    assert label_selector("app=x,tier in (web,db),!legacy")(obj)
    assert not label_selector("app!=x")(obj)
    assert not label_selector("tier notin (web)")(obj)
    assert field_selector("metadata.name=n")(obj) and not field_selector("metadata.name!=n")(obj)
    with pytest.raises(ValueError, match="labelSelector"):
        label_selector("app===")
    assert match_labels({"matchExpressions": [{"key": "app", "operator": "In",
                                               "values": ["x"]}]}, {"app": "x"})


def test_printer_column_jsonpath_and_bind_rewrite() -> None:
    obj = {"status": {"conditions": [{"type": "X", "status": "F"},
                                     {"type": "Ready", "status": "True"}]}}
    assert jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status') == "True"
    assert rebind(["m", "--host", "0.0.0.0", "--port", "8000"], "127.0.0.7") == [
        "m", "--host", "127.0.0.7", "--port", "8000"]
    assert rebind(["--host=0.0.0.0"], "127.0.0.7") == ["--host=127.0.0.7"]
