"""spec.kvCache: the engine's KV tiers under the device pool (engine/kv_offload/).

    kvCache:
      offloadGiB: 8                 # host tier: --kv-offloading-size 8
      disk:
        sizeGiB: 100                # disk tier: --kv-disk-dir /kv-cache --kv-disk-size 100
        volume: {emptyDir: {}}      # or {persistentVolumeClaim: {claimName: kv-blocks}}

What that adds to the children:
- the engine's flags (the settings table's rows; extraArgs may not set them);
- the host tier lives in the engine's own memory, so offloadGiB is added to the container's
  memory request and limit (spec.resources.memory; without it, the request alone);
- the disk tier's volume, mounted at KV_DISK_DIR: an emptyDir is the pod's own and outlives
  its container's restarts (a restarted engine finds its blocks); a named claim is shared by
  the replicas that mount it (on a node, or across nodes with ReadWriteMany), and the engine's
  file names keep models apart. The emptyDir's sizeLimit leaves headroom over sizeGiB: the
  engine trims its directory after each write, so a write in flight may pass the bound for a
  moment, and the kubelet evicts a pod whose emptyDir passes its limit.

The CRD's schema and CEL rules (paged_api/settings_k8s.crd_kv_cache_schema) refuse the same
specs as parse_kv_cache.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from paged_api import settings as engine_settings
from paged_api import settings_k8s

from paged_api.fields import DNS_SUBDOMAIN, InvalidSpecError, get_field, quantity_value

KV_DISK_DIR = "/kv-cache"
VOLUME_NAME = "kv-cache"
GIB, MIB = 2**30, 2**20
DISK_HEADROOM = (0.10, 256 * MIB)   # of the emptyDir's sizeLimit over sizeGiB: the larger


@dataclasses.dataclass(frozen=True, kw_only=True)
class KvCache:
    offload_gib: float | None = None     # host tier; None or 0: off
    disk_size_gib: float | None = None   # disk tier; None: off
    disk_claim: str | None = None        # the disk tier's claim; None: an emptyDir

    @property
    def host_bytes(self) -> int:
        return int(math.ceil((self.offload_gib or 0.0) * GIB))

    @property
    def tiers_on(self) -> bool:
        return self.host_bytes > 0 or self.disk_size_gib is not None


def _check(setting: engine_settings.Setting, value: Any, field: str) -> Any:
    try:
        return engine_settings.check(setting, value, f"spec.kvCache.{field}")
    except ValueError as exc:
        raise InvalidSpecError(str(exc)) from None


def parse_kv_cache(kv: Mapping[str, Any] | None, *, prefix_caching: bool) -> KvCache | None:
    """spec.kvCache -> KvCache (None when absent); InvalidSpecError names the field."""
    if kv is None:
        return None
    host = engine_settings.SETTINGS["kv_offloading_size"]   # spec.kvCache.offloadGiB
    offload = kv.get(host.field)
    out = KvCache(offload_gib=None if offload is None else _check(host, offload, host.field))
    disk = get_field(kv, "disk", "kvCache.", dict)
    if disk is not None:
        if disk.get("sizeGiB") is None:
            raise InvalidSpecError("spec.kvCache.disk.sizeGiB is required with "
                                   "spec.kvCache.disk: the disk tier's bound in GiB")
        size = _check(settings_k8s.KV_DISK_SIZE, disk["sizeGiB"], "disk.sizeGiB")
        out = dataclasses.replace(out, disk_size_gib=size, disk_claim=_parse_volume(
            get_field(disk, "volume", "kvCache.disk.", dict)))
    if out.tiers_on and not prefix_caching:
        raise InvalidSpecError("spec.kvCache needs spec.engine.enablePrefixCaching: the KV "
                               "tiers hold prefix-cache blocks")
    return out


def _parse_volume(volume: Mapping[str, Any] | None) -> str | None:
    """The claim's name, or None for an emptyDir."""
    if volume is None or ("emptyDir" in volume) == ("persistentVolumeClaim" in volume):
        raise InvalidSpecError("spec.kvCache.disk.volume must set exactly one of emptyDir "
                               "or persistentVolumeClaim")
    if "emptyDir" in volume:
        get_field(volume, "emptyDir", "kvCache.disk.volume.", dict, {})
        return None
    claim = get_field(volume, "persistentVolumeClaim", "kvCache.disk.volume.", dict, {})
    name = get_field(claim, "claimName", "kvCache.disk.volume.persistentVolumeClaim.", str)
    if name is None or not DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise InvalidSpecError("spec.kvCache.disk.volume.persistentVolumeClaim.claimName "
                               f"must name a claim (a DNS subdomain), got {name!r}")
    return name


def engine_args(kv: KvCache | None) -> list[str]:
    if kv is None or not kv.tiers_on:
        return []
    values = {"kv_offloading_size": kv.offload_gib if kv.host_bytes else None}
    if kv.disk_size_gib is not None:
        values |= {"kv_disk_dir": KV_DISK_DIR, "kv_disk_size": kv.disk_size_gib}
    return engine_settings.flags_for(values)


# The engine process without its KV pool and weights' share: Python, torch, transformers
# and the server (about 0.45 GiB resident with the default model, measured 2026-12-02)
CPU_RUNTIME_GIB = 0.75


def cpu_device_gib(memory: str | None) -> float | None:
    """A CPU engine's device memory (the engine's cpu_memory_gib, of which
    gpuMemoryUtilization is the fraction its weights and KV pool take) from
    spec.resources.memory: the container's memory less the runtime's, at least a quarter of
    it. None without spec.resources.memory (the engine's default, 2 GiB). The host tier is
    on top of spec.resources.memory (memory() below), so it takes nothing from this."""
    if not memory:
        return None
    gib = (quantity_value(memory) or 0.0) / GIB
    return max(gib - CPU_RUNTIME_GIB, gib / 4)


def memory_for_cpu_device(gib: float) -> float:
    """The least spec.resources.memory (GiB) whose cpu_device_gib is `gib`."""
    return min(gib + CPU_RUNTIME_GIB, 4 * gib)


def _bytes(n: float) -> str:
    """A byte count as a quantity: whole GiB, else MiB rounded up."""
    return f"{int(n) // GIB}Gi" if n % GIB == 0 else f"{math.ceil(n / MIB)}Mi"


def memory(memory: str | None, kv: KvCache | None) -> tuple[str | None, str | None]:
    """The engine container's memory (request, limit): spec.resources.memory for both, plus
    the host tier; without spec.resources.memory, the host tier as a request alone (the
    scheduler places the pod where it fits; nothing else is known to bound it)."""
    host = kv.host_bytes if kv is not None else 0
    if not host:
        return memory, memory
    if memory is None:
        return _bytes(host), None
    total = _bytes((quantity_value(memory) or 0.0) + host)
    return total, total


def volumes(kv: KvCache | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The disk tier's volume and its mount in the engine container."""
    if kv is None or kv.disk_size_gib is None:
        return [], []
    if kv.disk_claim is not None:
        source: dict[str, Any] = {"persistentVolumeClaim": {"claimName": kv.disk_claim}}
    else:
        size = kv.disk_size_gib * GIB
        limit = size + max(size * DISK_HEADROOM[0], DISK_HEADROOM[1])
        source = {"emptyDir": {"sizeLimit": _bytes(limit)}}
    return ([{"name": VOLUME_NAME, **source}],
            [{"name": VOLUME_NAME, "mountPath": KV_DISK_DIR}])
