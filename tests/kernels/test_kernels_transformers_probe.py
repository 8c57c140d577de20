"""Our kernels never answer for Hugging Face's hub-kernels library, and both install side by side.

transformers' probe (transformers.utils.import_utils.is_kernels_available) finds any importable
`kernels`, reads its version from distribution metadata (or, with none, from
`kernels.__version__` after importing it) and uses the library when that version is in range.
Our package installs as `paged_kernels` (the folder kernels/ holds it), so no install of this
project claims the name `kernels`, and in a checkout the folder kernels/ has no __init__.py:
at most an empty namespace package, which the probe ignores and any real `kernels` outranks.
The probe caches its answer, so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What pyproject.toml's packages.find reads, and the readme its metadata names.
SOURCES = ("pyproject.toml", "README.md", "engine", "kernels", "tuner", "loadtests",
           "operator", "localcluster")

PROBE = """
import importlib.util, json, sys
import transformers
from transformers.utils import import_utils
spec = importlib.util.find_spec("kernels")
import paged_kernels
print(json.dumps({
    "kernels_origin": spec.origin if spec else None,
    "seen_as": import_utils._is_package_available("kernels", return_version=True),
    "available": import_utils.is_kernels_available(),
    "paged_kernels": paged_kernels.__file__,
    "triton_imported": "triton" in sys.modules,
}))
"""

HIDE_OUR_METADATA = """
import importlib.metadata as md
_real_version, _real_map = md.version, md.packages_distributions
def _version(name):  # as in a plain checkout: no install of this project
    if name in ("paged-inference", "paged_inference"):
        raise md.PackageNotFoundError(name)
    return _real_version(name)
md.version = _version
md.packages_distributions = lambda: {k: [d for d in v if d != "paged-inference"]
                                     for k, v in _real_map().items()}
"""


def _hub_kernels() -> md.Distribution | None:
    """Hugging Face's `kernels` as installed here (scripts/setup.sh puts it in), if it is."""
    try:
        return md.distribution("kernels")
    except md.PackageNotFoundError:
        return None


def run_probe(path: list[Path], *, prelude: str = "") -> dict:
    """The probe under `python -S`: only `path`, then this interpreter's site-packages
    without their .pth files (an editable install's finder would add the checkout)."""
    paths = sysconfig.get_paths()
    site = list(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    boot = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}; sys.path += {site!r}\n"
    done = subprocess.run([sys.executable, "-S", "-c", boot + prelude + PROBE],
                          capture_output=True, text=True, timeout=120, cwd=path[0])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """`pip install` of this project (without dependencies) into a folder of its own."""
    src, target = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("site")
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", "--target", str(target),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return target


def test_an_install_claims_paged_kernels_and_never_kernels(installed):
    dist = next(installed.glob("paged_inference-*.dist-info"))
    top_level = set((dist / "top_level.txt").read_text().split())
    assert "paged_kernels" in top_level and "kernels" not in top_level
    assert not (installed / "kernels").exists()
    files = [line.split(",", 1)[0] for line in (dist / "RECORD").read_text().splitlines()]
    assert "paged_kernels/triton_attention.py" in files
    assert not [f for f in files if f.startswith("kernels/")]


def test_installed_beside_hub_kernels_both_import_and_the_probe_sees_theirs(installed):
    hub = _hub_kernels()
    if hub is None:
        pytest.skip("Hugging Face's `kernels` is not installed (scripts/setup.sh installs it)")
    hub_dir = Path(hub.locate_file(""))
    result = run_probe([installed, hub_dir])
    assert Path(result["kernels_origin"]) == hub_dir / "kernels" / "__init__.py"
    assert result["seen_as"] == [True, hub.version]
    assert Path(result["paged_kernels"]) == installed / "paged_kernels" / "__init__.py"
    assert result["triton_imported"] is False


def test_in_a_checkout_the_probe_never_reaches_our_package(tmp_path):
    """The repository root first on sys.path (as `python -m` from it), no install of this
    project: `kernels` is Hugging Face's when it is installed, else nothing the probe takes."""
    result = run_probe([REPO, REPO / "kernels"], prelude=HIDE_OUR_METADATA)
    assert Path(result["paged_kernels"]) == REPO / "kernels" / "paged_kernels" / "__init__.py"
    hub = _hub_kernels()
    if hub is None:
        assert result["kernels_origin"] is None  # kernels/ is a bare folder: a namespace
        assert result["seen_as"] == [False, "N/A"] and result["available"] is False
    else:
        assert Path(result["kernels_origin"]) == Path(hub.locate_file("kernels/__init__.py"))
        assert result["seen_as"] == [True, hub.version]
    assert result["triton_imported"] is False
