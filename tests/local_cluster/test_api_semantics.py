"""The emulated API server's patch, selector and printer-column semantics, without a cluster."""
from __future__ import annotations

import pytest

from localcluster.api.patch import json_patch, merge_patch, strategic_merge
from localcluster.api.selectors import field_selector, label_selector, match_labels
from localcluster.api.tables import jsonpath
from localcluster.api.kinds import BUILTIN
from localcluster.api.writes import ApiError, normalize
from localcluster.kubelet import launch as launch_mod
from localcluster.kubelet.launch import CannotRun, rebind, volumes

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


def test_mount_paths_are_rewritten_but_not_paths_into_the_image(tmp_path, monkeypatch) -> None:
    """A pod's /tmp emptyDir shadows /tmp, but not a checkout or a Python living under /tmp
    (a CI clone in /tmp/ci ran the real engine instead of the fake on PYTHONPATH)."""
    monkeypatch.setattr(launch_mod, "IMAGE_ROOTS", ("/tmp/ci", "/tmp/venv"))
    mounts = [("/tmp", tmp_path / "vol"), ("/etc/cfg", tmp_path / "cfg")]
    rewrite = launch_mod._rewrite
    assert rewrite("/tmp/out.json", mounts) == f"{tmp_path}/vol/out.json"
    assert rewrite("/tmp", mounts) == f"{tmp_path}/vol"
    assert rewrite("--out=/tmp/x", mounts) == f"--out={tmp_path}/vol/x"
    assert rewrite("--config=/etc/cfg/a.yaml", mounts) == f"--config={tmp_path}/cfg/a.yaml"
    assert rewrite("/tmp/ci/tests/fake", mounts) == "/tmp/ci/tests/fake"
    assert rewrite("/tmp/venv/bin/python", mounts) == "/tmp/venv/bin/python"
    assert rewrite("--model=/tmp/ci/m", mounts) == "--model=/tmp/ci/m"
    assert rewrite("/tmp/cix/y", mounts) == f"{tmp_path}/vol/cix/y"   # a prefix, not a parent
    assert rewrite("/etc/cfgx", mounts) == "/etc/cfgx"


SECRETS = next(k for k in BUILTIN if k.plural == "secrets")


def test_a_secret_stores_string_data_as_base64_data() -> None:
    secret = {"metadata": {"name": "s"}, "data": {"a": "eA=="}, "stringData": {"b": "key"}}
    normalize(SECRETS, secret)
    assert secret == {"metadata": {"name": "s"}, "data": {"a": "eA==", "b": "a2V5"},
                      "type": "Opaque"}
    with pytest.raises(ApiError, match=r"data\['a'\] is not base64.*stringData"):
        normalize(SECRETS, {"data": {"a": "not base64!"}})


def test_secret_volume_items_and_modes(tmp_path) -> None:
    objs = {("secrets", "k"): {"data": {"token": "czNjcmV0", "other": "eA=="}},
            ("configmaps", "c"): {"data": {"x": "1"}}}
    pod = {"metadata": {"namespace": "default"}, "spec": {"volumes": [
        {"name": "key", "secret": {"secretName": "k", "defaultMode": 0o440,
                                   "items": [{"key": "token", "path": "sub/api-key"}]}},
        {"name": "cfg", "configMap": {"name": "c"}}]}}
    lookup = lambda plural, ns, name: objs.get((plural, name))  # noqa: E731
    out = volumes(pod, tmp_path / "pod", tmp_path, lookup)
    assert sorted(p.name for p in out["key"].rglob("*")) == ["api-key", "sub"]
    key = out["key"] / "sub" / "api-key"
    assert key.read_text() == "s3cret" and key.stat().st_mode & 0o777 == 0o440
    plain = out["cfg"] / "x"
    assert plain.read_text() == "1" and plain.stat().st_mode & 0o777 == 0o644
    pod["spec"]["volumes"][0]["secret"]["items"] = [{"key": "missing", "path": "k"}]
    with pytest.raises(CannotRun, match="has no key 'missing'"):
        volumes(pod, tmp_path / "pod", tmp_path, lookup)
    pod["spec"]["volumes"][0]["secret"]["items"] = [{"key": "token", "path": "../../escape"}]
    with pytest.raises(CannotRun, match="leaves the volume"):
        volumes(pod, tmp_path / "pod", tmp_path, lookup)


def test_service_variables_come_before_the_containers_env_unless_links_are_off(
        tmp_path) -> None:
    """Kubernetes' NAME_SERVICE_HOST/_PORT variables (enableServiceLinks): the pod's
    namespace's, as the network hands them out; the container's own env wins."""
    asked = []

    def services(namespace: str) -> dict[str, str]:
        asked.append(namespace)
        return {"T_LOAD_SERVICE_HOST": "127.0.1.7", "T_LOAD_SERVICE_PORT": "5557",
                "OTHER_SERVICE_HOST": "127.0.1.8"}

    pod = {"metadata": {"name": "p", "namespace": "team"}, "spec": {}}
    container = {"command": ["true"], "env": [{"name": "OTHER_SERVICE_HOST", "value": "own"}]}
    out = launch_mod.launch(pod, container, "127.0.0.9", {}, tmp_path, tmp_path / "kc",
                            lambda *a: None, services=services)
    assert asked == ["team"]
    assert out.env["T_LOAD_SERVICE_HOST"] == "127.0.1.7" and out.env["T_LOAD_SERVICE_PORT"] == \
        "5557"
    assert out.env["OTHER_SERVICE_HOST"] == "own" and out.env["POD_IP"] == "127.0.0.9"
    pod["spec"]["enableServiceLinks"] = False
    out = launch_mod.launch(pod, container, "127.0.0.9", {}, tmp_path, tmp_path / "kc",
                            lambda *a: None, services=services)
    assert "T_LOAD_SERVICE_HOST" not in out.env and asked == ["team"]


def test_the_network_names_each_service_of_the_namespace_by_its_local_address(tmp_path):
    """Network.service_env: HOST is the address the Service's forwarder listens on (taken
    at once if the forwarder is not made yet), PORT the first port, PORT_<NAME> each named
    one; other namespaces' and deleted Services are left out."""
    from types import SimpleNamespace

    from localcluster.kubelet.network import Network

    def svc(ns, name, ports, deleted=False):
        meta = {"namespace": ns, "name": name,
                **({"deletionTimestamp": "2026-12-01T00:00:00Z"} if deleted else {})}
        return {"metadata": meta, "spec": {"ports": ports}}

    services = [svc("team", "t-load", [{"name": "locust-master", "port": 5557}]),
                svc("team", "web", [{"port": 80}, {"name": "metrics", "port": 9090}]),
                svc("other", "elsewhere", [{"port": 1}]),
                svc("team", "gone", [{"port": 2}], deleted=True)]
    store = SimpleNamespace(items=lambda kind: services)
    kubelet = SimpleNamespace(api=SimpleNamespace(store=store), kind=lambda plural: plural)
    network = Network(kubelet, tmp_path, {})
    try:
        env = network.service_env("team")
        assert set(env) == {"T_LOAD_SERVICE_HOST", "T_LOAD_SERVICE_PORT",
                            "T_LOAD_SERVICE_PORT_LOCUST_MASTER", "WEB_SERVICE_HOST",
                            "WEB_SERVICE_PORT", "WEB_SERVICE_PORT_METRICS"}
        assert env["T_LOAD_SERVICE_HOST"] == network.forwarders[("team", "t-load")].ip
        assert env["T_LOAD_SERVICE_HOST"].startswith("127.0.1.")
        assert env["WEB_SERVICE_HOST"] != env["T_LOAD_SERVICE_HOST"]
        assert (env["WEB_SERVICE_PORT"], env["WEB_SERVICE_PORT_METRICS"]) == ("80", "9090")
        assert network.service_env("team") == env   # the same addresses each time
    finally:
        network.close()
