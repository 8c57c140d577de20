"""spec.kvCache: the KV tiers' flags, the disk tier's volume and mount, the host tier in the
engine container's memory, and the specs the operator refuses (naming the field). Pure
functions: no cluster needed."""
from __future__ import annotations

import argparse

import pytest

from paged_api import kv_cache
from paged_operator import manifests
from paged_api.service import InvalidSpecError, parse_spec

EMPTY_DIR = {"emptyDir": {}}


def spec_of(**fields):
    return parse_spec({"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}, **fields},
                      name="svc", namespace="team")


def container(spec):
    return manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]


def pod_volumes(spec):
    return {v["name"]: v for v in manifests.deployment(spec)["spec"]["template"]["spec"][
        "volumes"]}


def engine_kwargs_of(spec):
    """What `python -m engine serve` makes of the container's arguments."""
    from engine.entrypoints.cli import add_serve_arguments, engine_kwargs
    parser = argparse.ArgumentParser(prog="python -m engine serve")
    add_serve_arguments(parser)
    return engine_kwargs(parser.parse_args(container(spec)["args"]))


def test_both_tiers_become_the_engines_flags_and_the_disk_is_the_mounted_volume():
    spec = spec_of(kvCache={"offloadGiB": 4, "disk": {"sizeGiB": 50, "volume": EMPTY_DIR}})
    kwargs = engine_kwargs_of(spec)
    assert (kwargs["kv_offloading_size"], kwargs["kv_disk_dir"], kwargs["kv_disk_size"]) == \
        (4.0, kv_cache.KV_DISK_DIR, 50.0)
    mounts = {m["name"]: m["mountPath"] for m in container(spec)["volumeMounts"]}
    assert mounts["kv-cache"] == kv_cache.KV_DISK_DIR == kwargs["kv_disk_dir"]
    # the ConfigMap's engine-args (and so the checksum that rolls the pods) carry them too
    assert "--kv-disk-size" in manifests.config_map(spec)["data"]["engine-args"]
    assert manifests.config_checksum(spec) != manifests.config_checksum(spec_of())


def test_no_kv_cache_or_a_zero_host_tier_adds_nothing():
    for spec in (spec_of(), spec_of(kvCache={}), spec_of(kvCache={"offloadGiB": 0})):
        kwargs = engine_kwargs_of(spec)
        assert kwargs.get("kv_offloading_size") is None and kwargs.get("kv_disk_dir") is None
        assert "kv-cache" not in pod_volumes(spec)
        assert container(spec)["resources"] == container(spec_of())["resources"]


def test_a_host_tier_alone_has_no_disk_flags_or_volume():
    spec = spec_of(kvCache={"offloadGiB": 0.5})
    args = container(spec)["args"]
    assert args[args.index("--kv-offloading-size") + 1] == "0.5"
    assert "--kv-disk-dir" not in args and "--kv-disk-size" not in args
    assert "kv-cache" not in pod_volumes(spec)


@pytest.mark.parametrize("size, limit", [
    (50, "55Gi"),             # 10 % headroom
    (1, "1280Mi"),            # at least 256 MiB of headroom
    (0.5, "768Mi"),
])
def test_an_empty_dir_disk_tier_is_limited_to_its_size_with_headroom(size, limit):
    spec = spec_of(kvCache={"disk": {"sizeGiB": size, "volume": EMPTY_DIR}})
    assert pod_volumes(spec)["kv-cache"] == {"name": "kv-cache",
                                             "emptyDir": {"sizeLimit": limit}}
    args = container(spec)["args"]
    assert args[args.index("--kv-disk-size") + 1] == repr(float(size))
    assert "--kv-offloading-size" not in args


def test_a_disk_tier_with_a_zero_host_tier_passes_no_host_flag():
    spec = spec_of(kvCache={"offloadGiB": 0, "disk": DISK})
    args = container(spec)["args"]
    assert "--kv-offloading-size" not in args and "--kv-disk-dir" in args
    longest = "a" * 253      # a claim name's longest
    spec = spec_of(kvCache={"disk": {"sizeGiB": 1, "volume": {
        "persistentVolumeClaim": {"claimName": longest}}}})
    assert pod_volumes(spec)["kv-cache"]["persistentVolumeClaim"]["claimName"] == longest


def test_a_claim_disk_tier_mounts_the_named_claim():
    spec = spec_of(kvCache={"disk": {"sizeGiB": 100, "volume": {
        "persistentVolumeClaim": {"claimName": "kv-blocks"}}}})
    assert pod_volumes(spec)["kv-cache"] == {
        "name": "kv-cache", "persistentVolumeClaim": {"claimName": "kv-blocks"}}
    assert manifests.model_cache_claim(spec) is None  # the user's claim: none is made


@pytest.mark.parametrize("memory, offload, expected", [
    ("8Gi", 4, ("12Gi", "12Gi")),
    ("8Gi", 0.5, ("8704Mi", "8704Mi")),
    ("8G", 1, ("8654Mi", "8654Mi")),           # 8e9 + 2^30 bytes, rounded up to a MiB
    (17179869184, 2, ("18Gi", "18Gi")),        # a plain byte count
    (None, 4, ("4Gi", None)),                   # no memory given: the host tier as a request
    ("8Gi", 0, ("8Gi", "8Gi")),
])
def test_the_host_tier_adds_to_the_engine_containers_memory(memory, offload, expected):
    resources = {"gpus": 0} | ({"memory": memory} if memory is not None else {})
    spec = spec_of(resources=resources, kvCache={"offloadGiB": offload})
    got = container(spec)["resources"]
    assert (got.get("requests", {}).get("memory"), got.get("limits", {}).get("memory")) == \
        expected


def test_a_disk_tier_does_not_add_to_memory():
    spec = spec_of(resources={"memory": "8Gi"},
                   kvCache={"disk": {"sizeGiB": 20, "volume": EMPTY_DIR}})
    assert container(spec)["resources"]["limits"]["memory"] == "8Gi"


def test_kv_cache_flags_are_reserved_from_extra_args():
    for flag in ("--kv-offloading-size", "--kv-disk-dir=/x", "--kv-disk-si"):
        with pytest.raises(InvalidSpecError, match="spec.kvCache"):
            spec_of(engine={"extraArgs": [flag, "1"]})
    spec_of(engine={"extraArgs": ["--kv-offloading-backend", "native"]})


DISK = {"sizeGiB": 2, "volume": EMPTY_DIR}
INVALID = [
    ({"offloadGiB": -1}, "spec.kvCache.offloadGiB must be a number >= 0 (or unset), got -1"),
    ({"offloadGiB": "4"}, "spec.kvCache.offloadGiB must be a number >= 0 (or unset), got '4'"),
    ({"offloadGiB": True},
     "spec.kvCache.offloadGiB must be a number >= 0 (or unset), got True"),
    ({"disk": {"volume": EMPTY_DIR}},
     "spec.kvCache.disk.sizeGiB is required with spec.kvCache.disk: the disk tier's bound "
     "in GiB"),
    ({"disk": {"sizeGiB": 0, "volume": EMPTY_DIR}},
     "spec.kvCache.disk.sizeGiB must be a number > 0, got 0"),
    ({"disk": {"sizeGiB": 2}},
     "spec.kvCache.disk.volume must set exactly one of emptyDir or persistentVolumeClaim"),
    ({"disk": {"sizeGiB": 2, "volume": {}}},
     "spec.kvCache.disk.volume must set exactly one of emptyDir or persistentVolumeClaim"),
    ({"disk": {"sizeGiB": 2, "volume": {"emptyDir": {}, "persistentVolumeClaim": {
        "claimName": "c"}}}},
     "spec.kvCache.disk.volume must set exactly one of emptyDir or persistentVolumeClaim"),
    ({"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": {}}}},
     "spec.kvCache.disk.volume.persistentVolumeClaim.claimName must name a claim (a DNS "
     "subdomain), got None"),
    ({"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": None}}},
     "spec.kvCache.disk.volume.persistentVolumeClaim.claimName must name a claim (a DNS "
     "subdomain), got None"),
    ({"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": {"claimName": "Bad_Name"}}}},
     "spec.kvCache.disk.volume.persistentVolumeClaim.claimName must name a claim (a DNS "
     "subdomain), got 'Bad_Name'"),
    ({"disk": "fast"}, "spec.kvCache.disk must be an object, got 'fast'"),
    ({"disk": {"sizeGiB": 2, "volume": "x"}},
     "spec.kvCache.disk.volume must be an object, got 'x'"),
    ({"disk": {"sizeGiB": 2, "volume": {"emptyDir": "yes"}}},
     "spec.kvCache.disk.volume.emptyDir must be an object, got 'yes'"),
    ({"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": "c"}}},
     "spec.kvCache.disk.volume.persistentVolumeClaim must be an object, got 'c'"),
    ({"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": {"claimName": 5}}}},
     "spec.kvCache.disk.volume.persistentVolumeClaim.claimName must be a string, got 5"),
    ({"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": {"claimName": "a" * 254}}}},
     "spec.kvCache.disk.volume.persistentVolumeClaim.claimName must name a claim (a DNS "
     f"subdomain), got {'a' * 254!r}"),
]


@pytest.mark.parametrize("kv, message", INVALID, ids=[m for _, m in INVALID])
def test_a_refused_kv_cache_names_the_field(kv, message):
    with pytest.raises(InvalidSpecError) as error:
        spec_of(kvCache=kv)
    assert str(error.value) == message


@pytest.mark.parametrize("kv", [{"offloadGiB": 1}, {"disk": DISK}])
def test_tiers_without_prefix_caching_are_refused(kv):
    with pytest.raises(InvalidSpecError) as error:
        spec_of(engine={"enablePrefixCaching": False}, kvCache=kv)
    assert str(error.value) == ("spec.kvCache needs spec.engine.enablePrefixCaching: the KV "
                                "tiers hold prefix-cache blocks")
    # tiers off (or prefix caching on) are fine
    spec_of(engine={"enablePrefixCaching": False}, kvCache={"offloadGiB": 0})
    spec_of(engine={"enablePrefixCaching": True}, kvCache=kv)
