"""Helpers for the chart tests: the real helm binary, rendering, schema validation."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "paged-inference-operator"
CRD_FILE = CHART / "crds" / "pagedinferenceservices.yaml"
EXAMPLE = ROOT / "examples" / "service.yaml"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and a current one.
K8S_VERSIONS = ("1.28.0", "1.33.0")


def tool(name: str) -> str:
    """Path of kubectl/helm: on PATH, or in ./bin where scripts/install-k8s-tools.sh puts it."""
    found = shutil.which(name) or (str(ROOT / "bin" / name)
                                   if os.access(ROOT / "bin" / name, os.X_OK) else None)
    if found is None:
        pytest.fail(f"{name} not found on PATH or in {ROOT / 'bin'}: "
                    "run scripts/install-k8s-tools.sh")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # Keep helm's caches and config out of $HOME: tests must not depend on a user's setup.
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/helm-test/cache",
           "HELM_CONFIG_HOME": "/tmp/helm-test/config", "HELM_DATA_HOME": "/tmp/helm-test/data"}
    proc = subprocess.run([tool("helm"), *args], capture_output=True, text=True, env=env,
                          timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(*set_args: str, values: dict[str, Any] | None = None, tmp_path: Path | None = None,
           include_crds: bool = False) -> list[dict[str, Any]]:
    args = ["template", "pio", str(CHART), "--namespace", "inference"]
    if include_crds:
        args.append("--include-crds")
    if values is not None:
        assert tmp_path is not None
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["--values", str(path)]
    for item in set_args:
        args += ["--set", item]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def validate_k8s(manifest: dict[str, Any]) -> None:
    """Strict validation against the Kubernetes OpenAPI schemas (unknown fields fail)."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


def crd_validator() -> jsonschema.Draft4Validator:
    """The CRD's openAPIV3Schema as a JSON Schema (OpenAPI 3.0 follows draft 4's keywords:
    boolean exclusiveMinimum, no const). CEL rules (x-kubernetes-validations) run in cel_tools.py."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


# A minimal valid resource; with_spec(engine__blockSize=32) sets spec.engine.blockSize.
BASE = {"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}}


def with_spec(**changes):
    body = {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceService", "metadata": {"name": "svc"},
            "spec": copy.deepcopy(BASE)}
    for path, value in changes.items():
        node = body["spec"]
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return body
