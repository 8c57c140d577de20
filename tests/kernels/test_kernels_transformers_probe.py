"""transformers must never mistake our `kernels/` package for the Hugging Face hub-kernels library.

transformers' probe (transformers.utils.import_utils.is_kernels_available) finds any importable
`kernels`, reads its version from distribution metadata (or, with none, from
`kernels.__version__` after importing it) and accepts only KERNELS_MIN_VERSION <= v <
KERNELS_MAX_VERSION. Our distribution, paged-inference, is 0.1.0: below that range. The probe
caches its answer, so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, json, sys
import transformers
from transformers.utils import import_utils
spec = importlib.util.find_spec("kernels")
print(json.dumps({
    "kernels_origin": spec.origin if spec else None,
    "available": import_utils.is_kernels_available(),
    "seen_as": import_utils._is_package_available("kernels", return_version=True),
    "min_version": import_utils.KERNELS_MIN_VERSION,
    "triton_imported": "triton" in sys.modules,
}))
"""


HIDE_METADATA = """
import importlib.metadata as md
_real_version = md.version
def _version(name):  # as in a plain checkout: no distribution claims `kernels`
    if name in ("kernels", "paged-inference", "paged_inference"):
        raise md.PackageNotFoundError(name)
    return _real_version(name)
md.version = _version
"""


def run_probe(extra_path: Path | None = None, *, hide_metadata: bool = False) -> dict:
    path = [str(REPO)] + ([str(extra_path)] if extra_path else [])
    code = f"import sys; sys.path[:0] = {path!r}\n" + (HIDE_METADATA if hide_metadata else "") + PROBE
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_probe_finds_our_package_and_rejects_it():
    result = run_probe()  # this environment as it is, installed or not
    assert Path(result["kernels_origin"]) == REPO / "kernels" / "__init__.py"  # the probe does find our package
    assert result["seen_as"][1] in ("0.1.0", "N/A")
    assert result["available"] is False
    assert result["triton_imported"] is False  # probing imported our package cheaply


def test_checkout_without_metadata_is_not_hub_kernels():
    result = run_probe(hide_metadata=True)
    assert result["seen_as"] == [True, "N/A"]  # imported, no __version__: never a viable version
    assert result["available"] is False


def test_installed_distribution_is_not_hub_kernels(tmp_path):
    # What an install leaves: paged-inference metadata claiming the top-level `kernels`.
    from packaging.version import Version

    dist = tmp_path / "paged_inference-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: paged-inference\nVersion: 0.1.0\n")
    (dist / "top_level.txt").write_text("engine\nkernels\ntuner\nloadtests\n")
    result = run_probe(tmp_path)
    assert result["seen_as"] == [True, "0.1.0"]  # the probe read our distribution's version
    assert result["available"] is False
    assert Version("0.1.0") < Version(result["min_version"])


def test_pyproject_version_stays_below_hub_kernels():
    from packaging.version import Version
    from transformers.utils.import_utils import KERNELS_MIN_VERSION

    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^name = "paged-inference"$', text, re.M)
    version = re.search(r'^version = "([^"]+)"$', text, re.M).group(1)
    assert Version(version) < Version(KERNELS_MIN_VERSION)
