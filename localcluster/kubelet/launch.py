"""How a container of a pod becomes a local process: argv, environment and volumes.

- The image's entrypoint: this project's images run `python -m engine serve` (engine image)
  or `python -m paged_operator` (operator image); `python` is this checkout's interpreter.
  A container with its own `command` runs that command on the host. Other images cannot run.
- The pod's loopback address replaces the bind address: `--host X` / `--host=X` become the
  pod IP (manifests.py passes `--host 0.0.0.0 --port 8000`; every pod keeps port 8000), and
  so does 0.0.0.0 in a URL argument (the operator's `--liveness=http://0.0.0.0:8080/healthz`).
- Volumes are folders under the pod's directory (emptyDir, configMap/secret contents written
  out) or under DIR/volumes (a persistentVolumeClaim, e.g. the model cache, kept across pods);
  an argument or env value under a mount path is rewritten to the folder (/dev/shm is kept),
  except paths into the "image" (this checkout and this Python installation): a checkout
  under /tmp stays visible to a pod that mounts an emptyDir at /tmp.
"""
from __future__ import annotations

import base64
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ENTRYPOINTS = {"engine": ["python", "-m", "engine", "serve"],
               "operator": ["python", "-m", "paged_operator"]}
KEEP_MOUNTS = ("/dev/shm",)
# What every pod's "image" holds, never shadowed by a volume mounted above it
IMAGE_ROOTS = tuple(sorted({os.path.abspath(p) for p in (
    sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
    Path(__file__).resolve().parents[2])}))
Lookup = Callable[[str, str, str], dict[str, Any] | None]   # (plural, namespace, name) -> obj


class CannotRun(Exception):
    """The container cannot run here; the message becomes the waiting reason's message."""


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


def entrypoint(image: str) -> list[str]:
    repo = image.rsplit("/", 1)[-1].split(":")[0].split("@")[0]
    for key, argv in ENTRYPOINTS.items():
        if key in repo:
            return list(argv)
    raise CannotRun(f"image {image!r} is not this project's: the local kubelet runs the "
                    "engine and operator images, or a container with its own `command`")


def host_python(argv: list[str]) -> list[str]:
    if argv and re.fullmatch(r"python(3(\.\d+)?)?", argv[0]):
        return [sys.executable, *argv[1:]]
    return argv


def rebind(args: list[str], ip: str) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--host" and i + 1 < len(args):
            out += ["--host", ip]
            skip = True
        elif arg.startswith("--host="):
            out.append(f"--host={ip}")
        else:   # a listen URL on every address, e.g. the operator's --liveness=http://0.0.0.0:8080
            out.append(arg.replace("://0.0.0.0:", f"://{ip}:"))
    return out


def _write_keys(vol: dict[str, Any], source: str, obj: dict[str, Any] | None,
                path: Path) -> None:
    """A configMap or secret volume as the kubelet writes it: every key as a file, or only
    `items` (key -> relative path, per-item `mode`), files with `defaultMode` (0644)."""
    ref = vol.get("name") or vol.get("secretName")
    if obj is None:
        if vol.get("optional"):
            return
        raise CannotRun(f'{source} "{ref}" not found')
    files = {k: (base64.b64decode(v) if source == "secret" else v.encode())
             for k, v in (obj.get("data") or {}).items()}
    files.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    default_mode = int(vol.get("defaultMode", 0o644))
    items = vol.get("items")
    wanted = [(k, k, default_mode) for k in files] if items is None else \
        [(i["key"], i["path"], int(i.get("mode", default_mode))) for i in items]
    for key, rel, mode in wanted:
        if key not in files:
            if vol.get("optional"):
                continue
            raise CannotRun(f'{source} "{ref}" has no key {key!r}')
        target = (path / rel).resolve()
        if path.resolve() not in target.parents:
            raise CannotRun(f"{source} volume item path {rel!r} leaves the volume")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(files[key])
        target.chmod(mode | 0o400)   # the pod runs as this user: keep it readable


def volumes(pod: dict[str, Any], pod_dir: Path, cluster_dir: Path,
            lookup: Lookup) -> dict[str, Path]:
    """Make each volume's folder; returns {volume name: folder}."""
    ns = pod["metadata"]["namespace"]
    out: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        if "persistentVolumeClaim" in vol:
            path = cluster_dir / "volumes" / ns / vol["persistentVolumeClaim"]["claimName"]
        else:
            path = pod_dir / "volumes" / name
            shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
        for source, plural in (("configMap", "configmaps"), ("secret", "secrets")):
            if source in vol:
                _write_keys(vol[source], source, lookup(plural, ns, vol[source].get(
                    "name") or vol[source].get("secretName")), path)
        out[name] = path
    return out


def _in_image(path: str) -> bool:
    path = os.path.abspath(path)
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in IMAGE_ROOTS)


def _rewrite(value: str, mounts: list[tuple[str, Path]]) -> str:
    for mount, path in mounts:
        mount = mount.rstrip("/") or "/"
        if (value == mount or value.startswith(mount + "/")) and not _in_image(value):
            return str(path) + value[len(mount):]

        def inside(match: re.Match) -> str:   # inside a flag: --config=/etc/x
            whole = match.group(1) + match.group(2)
            return whole if _in_image(whole) else str(path) + match.group(2)
        value = re.sub(rf"(?<==)({re.escape(mount)})((?:/\S*)?)$", inside, value)
    return value


def _env_value(item: dict[str, Any], pod: dict[str, Any], lookup: Lookup) -> str | None:
    if "value" in item:
        return str(item["value"])
    source = item.get("valueFrom") or {}
    ns = pod["metadata"]["namespace"]
    if "fieldRef" in source:
        path = source["fieldRef"]["fieldPath"]
        obj: Any = pod
        for part in path.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else None
        return None if obj is None else str(obj)
    for key, plural in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
        if key in source:
            ref = source[key]
            obj = lookup(plural, ns, ref["name"]) or {}
            value = (obj.get("data") or {}).get(ref["key"])
            if value is None:
                if ref.get("optional"):
                    return None
                raise CannotRun(f'{plural[:-1]} "{ref["name"]}" has no key {ref["key"]!r}')
            return base64.b64decode(value).decode() if plural == "secrets" else value
    return None


def launch(pod: dict[str, Any], container: dict[str, Any], ip: str, vols: dict[str, Path],
           pod_dir: Path, kubeconfig: Path, lookup: Lookup,
           services: Callable[[str], dict[str, str]] = lambda namespace: {}) -> Launch:
    """`services(namespace)`: the Service variables Kubernetes gives a pod there (unless
    spec.enableServiceLinks is false); the container's own env comes after them."""
    argv = host_python(list(container.get("command") or entrypoint(container.get("image", ""))))
    argv += list(container.get("args") or [])
    mounts = sorted(((m["mountPath"], vols[m["name"]]) for m in
                     container.get("volumeMounts") or []
                     if m["name"] in vols and m["mountPath"] not in KEEP_MOUNTS),
                    key=lambda mp: -len(mp[0]))
    argv = rebind([_rewrite(a, mounts) for a in argv], ip)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1",
           "HOSTNAME": pod["metadata"]["name"], "LANG": os.environ.get("LANG", "C.UTF-8"),
           "POD_IP": ip}
    for key in ("PYTHONPATH", "VIRTUAL_ENV"):
        if key in os.environ:
            env[key] = os.environ[key]
    if pod["spec"].get("enableServiceLinks", True) is not False:
        env.update(services(pod["metadata"]["namespace"]))
    if pod["spec"].get("automountServiceAccountToken", True) is not False:
        env["KUBECONFIG"] = str(kubeconfig)   # the pod may talk to the API, as in-cluster
    for item in container.get("env") or []:
        value = _env_value(item, pod, lookup)
        if value is not None:
            env[item["name"]] = _rewrite(value, mounts)
    cwd = pod_dir / "work"
    cwd.mkdir(parents=True, exist_ok=True)
    if container.get("workingDir"):
        cwd = Path(_rewrite(container["workingDir"], mounts))
    return Launch(argv, env, cwd)
