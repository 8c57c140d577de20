#!/usr/bin/env python
"""Mutation testing of the engine's policy code with mutmut 3 (`pip install -e '.[mutation]'`).

    python scripts/mutation.py [--keep DIR] [--max-children N] [--list-survivors]

mutmut 3 mutates a copy of the sources under `mutants/` and imports it ahead of the
installed package; with this project installed editable, the tests could still import the
unmutated `engine/` from the checkout. So the run happens in a scratch directory that holds
only what the tests need (the `engine` package without the server and router, the shared
conftest and the fast tests below), where `engine` resolves to mutmut's copy.

Mutated: engine/kv_cache_manager.py, engine/scheduler.py, engine/sampler.py. Tests: the
model-free ones that cover them. Last line: `mutation score: K/N killed (P%)`, where N counts
every mutant that some test reaches (mutants of lines no selected test executes are listed
as "no tests" and left out of N). Not in CI: it takes minutes (docs/mutation.md).
"""
from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTATED = ["engine/kv_cache_manager.py", "engine/scheduler.py", "engine/sampler.py"]
TESTS = ["tests/engine/test_sampler_oracle.py", "tests/engine/test_scheduler_policy.py",
         "tests/engine/test_kv_scheduler_properties.py"]
NOT_NEEDED = ["entrypoints", "router"]  # engine subpackages the selected tests never import

CONFIG = """\
[tool.mutmut]
source_paths = ["engine"]
only_mutate = {mutated}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]
pytest_add_cli_args_test_selection = {tests}
"""


def _prepare(work: Path) -> None:
    shutil.copytree(REPO / "engine", work / "engine",
                    ignore=shutil.ignore_patterns("__pycache__", *NOT_NEEDED))
    (work / "tests" / "engine").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "conftest.py", work / "tests" / "conftest.py")
    for test in TESTS:
        shutil.copy(REPO / test, work / test)
    as_list = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
    (work / "pyproject.toml").write_text(CONFIG.format(mutated=as_list(MUTATED),
                                                       tests=as_list(TESTS)))


def _results(work: Path) -> dict[str, str]:
    out = subprocess.run(["mutmut", "results", "--all", "true"], cwd=work, text=True,
                         capture_output=True, check=True).stdout
    status = {}
    for line in out.splitlines():
        name, sep, state = line.strip().rpartition(": ")
        if sep:
            status[name] = state
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it "
                        "(then `cd DIR && mutmut show NAME` prints a mutant's diff)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--list-survivors", action="store_true")
    args = parser.parse_args(argv)
    if shutil.which("mutmut") is None:
        sys.exit("mutmut is not installed: pip install -e '.[mutation]'")
    work = args.keep or Path(tempfile.mkdtemp(prefix="mutation-"))
    if work.exists() and any(work.iterdir()):
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        _prepare(work)
        started = time.monotonic()
        run = subprocess.run(["mutmut", "run", "--max-children", str(args.max_children)],
                             cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        if run.returncode != 0:
            sys.stderr.write(run.stderr[-3000:])
            return run.returncode
        status = _results(work)
        elapsed = time.monotonic() - started
        per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for name, state in status.items():
            per_file[name.split(".x", 1)[0].split("__mutmut")[0].rsplit(".", 1)[0]
                     if ".x" in name else name.rsplit(".", 1)[0]][state] += 1
        for module, counts in sorted(per_file.items()):
            print(f"{module:28} " + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
        survivors = sorted(n for n, s in status.items() if s == "survived")
        if args.list_survivors:
            print("survivors:\n  " + "\n  ".join(survivors))
        total = collections.Counter(status.values())
        reached = sum(v for k, v in total.items() if k != "no tests")
        killed = total["killed"] + total["timeout"]
        print(f"{len(status)} mutants, {total['no tests']} on lines no selected test runs; "
              f"{elapsed:.0f} s")
        print(f"mutation score: {killed}/{reached} killed ({100 * killed / max(reached, 1):.1f}%)")
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
