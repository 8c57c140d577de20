#!/usr/bin/env python
"""Mutation testing of the policy code with mutmut 3 (`pip install -e '.[mutation]'`).

    python scripts/mutation.py [--only FILE ...] [--keep DIR] [--max-children N]
                               [--list-survivors]

mutmut 3 mutates a copy of the sources under `mutants/` and puts that directory first on
sys.path; with this project installed editable, the tests could still import the unmutated
packages from the checkout, and mutmut only finds packages at the top of its working
directory (the operator's lives under operator/). So the run happens in a scratch directory
that holds only what the tests need: the packages of PACKAGES at its top level (so
`paged_operator` is `<scratch>/paged_operator`, resolved to mutmut's copy), the shared
conftest and the fast tests of TARGETS (no cluster, model or network).

Mutated: the files (or folders, `engine/spec_decode/`) of TARGETS (`--only` picks some).
Each target's line and the last line give `K/N killed (P%)`, where timeouts count as
killed and N counts every mutant: one on a line no selected test executes ("no tests") is
not killed. Not in CI: a complete run takes the best part of an hour on two cores
(docs/mutation.md); `--only` runs one target in minutes.
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
# Each mutated file (as the checkout holds it) and the fast tests that cover it. mutmut
# runs, for each mutant, only the selected tests that executed the mutated function.
_KV_SCHEDULER_TESTS = ["tests/engine/test_scheduler_policy.py",
                       "tests/engine/test_scheduler_accounting.py",
                       "tests/engine/test_kv_cache_accounting.py",
                       "tests/engine/test_kv_scheduler_properties.py",
                       "tests/engine/test_spec_decode_proposer.py",
                       "tests/engine/test_kv_events.py"]
# The host and disk tiers under the device pool (engine/kv_offload/, hooks in
# kv_cache_manager.py). Not test_kv_offload_metrics.py: it starts a server process.
_KV_OFFLOAD_TESTS = ["tests/engine/test_kv_offload.py",
                     "tests/engine/test_kv_offload_units.py",
                     "tests/engine/test_kv_offload_disk.py"]
# KV events from the recorder to the router's index (engine/kv_events.py,
# router/paged_router/kv_follower.py, kv_index.py)
_KV_EVENT_TESTS = ["tests/engine/test_kv_events_snapshot.py",
                   "tests/engine/test_kv_events_publisher.py",
                   "tests/router/test_router_kv_resync.py",
                   "tests/router/test_router_kv_follow_live.py",
                   "tests/router/test_router_precise.py"]
_SPEC_TESTS = ["tests/engine/test_spec_decode_gate.py",
               "tests/engine/test_spec_decode_proposer.py",
               "tests/engine/test_spec_decode_protocol.py",
               "tests/engine/test_spec_decode_adaptive.py",
               "tests/engine/test_spec_decode_sampling.py",
               "tests/engine/test_spec_decode.py",
               "tests/engine/test_spec_decode_grammar.py",
               "tests/engine/test_spec_decode_suffix.py",
               "tests/engine/test_spec_decode_suffix_oracle.py",
               "tests/engine/test_spec_decode_suffix_batch.py",
               "tests/engine/test_spec_decode_suffix_parity.py"]
_OPERATOR_TESTS = ["tests/operator/test_operator_manifests.py",
                   "tests/operator/test_operator_engine_contract.py",
                   "tests/operator/test_operator_spec_parsing.py",
                   "tests/operator/test_operator_manifests_whole.py"]
TARGETS = {
    "engine/kv_cache_manager.py": [*_KV_SCHEDULER_TESTS, *_KV_OFFLOAD_TESTS],
    "engine/kv_blocks.py": [*_KV_SCHEDULER_TESTS, *_KV_OFFLOAD_TESTS],  # the invariant check
    "engine/kv_offload/model_identity.py": ["tests/engine/test_kv_model_identity.py",
                                            "tests/engine/test_kv_offload_disk.py"],
    "engine/kv_offload/tiers.py": [*_KV_OFFLOAD_TESTS, "tests/engine/test_kv_cache_accounting.py"],
    "engine/kv_offload/host.py": _KV_OFFLOAD_TESTS,
    "engine/kv_offload/disk.py": _KV_OFFLOAD_TESTS,
    "engine/scheduler.py": _KV_SCHEDULER_TESTS,
    "engine/sampler.py": ["tests/engine/test_sampler_oracle.py",
                          "tests/engine/test_sampler_draws.py",
                          "tests/engine/test_sampling_bias_best_of.py",
                          "tests/engine/test_spec_decode_sampling.py",
                          "tests/engine/test_structured_outputs.py",
                          "tests/engine/test_prompt_logprobs.py"],
    "engine/kv_events.py": [*_KV_EVENT_TESTS, "tests/engine/test_kv_events_wire.py",
                            "tests/engine/test_kv_events.py"],
    "router/paged_router/kv_follower.py": _KV_EVENT_TESTS,
    "router/paged_router/kv_index.py": [*_KV_EVENT_TESTS, "tests/router/test_router_kv_index.py",
                                  "tests/router/test_router_precise_footprint.py"],
    "engine/structured_output/manager.py": ["tests/engine/test_structured_outputs.py",
                                            "tests/engine/test_structured_output_manager.py",
                                            "tests/engine/test_spec_decode_grammar.py"],
    "engine/spec_decode/": _SPEC_TESTS,  # a folder: every module in it
    "operator/paged_operator/manifests.py": _OPERATOR_TESTS,
    "api/paged_api/service.py": _OPERATOR_TESTS,
    "api/paged_api/kv_cache.py": ["tests/operator/test_operator_kv_cache.py",
                                            *_OPERATOR_TESTS],
    "tuner/measure/scoring.py": ["tests/tuner/test_tuner_scoring.py",
                         "tests/tuner/test_tuner_scoring_figures.py"],
}
# Package folder in the checkout -> its importable name, i.e. its place in the scratch dir
# (pyproject's packages.find also looks under api/, operator/, kernels/ and router/). The
# root conftest imports the engine, everything imports paged_api (the settings table, the
# space grammar, the contract, the workload names), the engine's attention imports
# paged_kernels (tests that run a model), and the router's targets are paged_router's, so
# all seven are always copied.
PACKAGES = {"engine": "engine", "operator/paged_operator": "paged_operator", "tuner": "tuner",
            "loadtests": "loadtests", "kernels/paged_kernels": "paged_kernels",
            "router/paged_router": "paged_router", "api/paged_api": "paged_api"}
NOT_NEEDED = ["__pycache__", "*.md"]
# Only the root conftest: tests/operator's starts the API-server emulator, tests/tuner's
# adds the load tests' fake server, neither of which the selected tests use.
CONFTEST = "tests/conftest.py"
# Test modules the selected tests import helpers from (copied, not selected).
SUPPORT = ["tests/engine/test_prefix_and_cow.py", "tests/router/router_fakes.py",
           "tests/router/test_router_bounded_load.py", "tests/router/test_router_precise.py"]
# Tests of the selected modules left out of every run: they start engine or router
# processes (seconds to tens of seconds each, per mutant), for what the in-process tests of
# the same code already cover.
DESELECT = ["tests/engine/test_kv_offload_disk.py::test_two_engine_processes_share_one_directory",
            "tests/router/test_router_precise.py::"
            "test_precise_without_a_tokenizer_waits_for_the_engines_and_says_why",
            "tests/engine/test_kv_offload_disk.py::test_the_bound_holds_with_two_writing_processes"]

CONFIG = """\
[tool.mutmut]
source_paths = {packages}
only_mutate = {mutated}
pytest_add_cli_args = {cli_args}
pytest_add_cli_args_test_selection = {tests}
"""


def _scratch_path(repo_path: str) -> str:
    """Where a checkout file lies in the scratch dir: operator/paged_operator/x.py ->
    paged_operator/x.py."""
    for folder, name in PACKAGES.items():
        if repo_path.startswith(folder + "/"):
            return name + repo_path[len(folder):]
    raise ValueError(f"{repo_path} is in none of {sorted(PACKAGES)}")


def _module(repo_path: str) -> str:
    """The dotted prefix of a target's mutant names (a folder's: its package)."""
    return _scratch_path(repo_path).removesuffix(".py").rstrip("/").replace("/", ".")


def _pattern(repo_path: str) -> str:
    """mutmut's only_mutate glob of a target: the file, or every file under the folder."""
    scratch = _scratch_path(repo_path)
    return scratch + "*" if scratch.endswith("/") else scratch


def _prepare(work: Path, mutated: list[str], tests: list[str]) -> None:
    for folder, name in PACKAGES.items():
        shutil.copytree(REPO / folder, work / name, ignore=shutil.ignore_patterns(*NOT_NEEDED))
    for test in [CONFTEST, *SUPPORT, *tests]:
        (work / test).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / test, work / test)
    as_list = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
    (work / "pyproject.toml").write_text(CONFIG.format(
        packages=as_list(PACKAGES.values()), mutated=as_list(map(_pattern, mutated)),
        cli_args=as_list(["-p", "no:cacheprovider", "-q", "-x",
                          *(arg for test in DESELECT if test.split("::")[0] in tests
                            for arg in ("--deselect", test))]),
        tests=as_list(tests)))


def _results(work: Path) -> dict[str, str]:
    out = subprocess.run(["mutmut", "results", "--all", "true"], cwd=work, text=True,
                         capture_output=True, check=True).stdout
    status = {}
    for line in out.splitlines():
        name, sep, state = line.strip().rpartition(": ")
        if sep:
            status[name] = state
    return status


def _report(status: dict[str, str], mutated: list[str], elapsed: float,
            list_survivors: bool) -> None:
    modules = {_module(path): path for path in mutated}
    per_file: dict[str, collections.Counter] = {path: collections.Counter() for path in mutated}
    for name, state in status.items():
        module = max((m for m in modules if name.startswith(m + ".")), key=len)
        per_file[modules[module]][state] += 1
    for path, counts in per_file.items():
        print(f"{path:38} {sum(counts.values()):4} mutants  "
              + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
              + f"  score {_score(counts)}")
    if list_survivors:
        survivors = sorted(n for n, s in status.items() if s == "survived")
        print("survivors:" + "".join(f"\n  {name}" for name in survivors))
    total = collections.Counter(status.values())
    print(f"{len(status)} mutants, {total['no tests']} on lines no selected test runs "
          f"(counted as not killed); {elapsed:.0f} s")
    print(f"mutation score: {_score(total)}")


def _score(counts: collections.Counter) -> str:
    """K/N killed (P%): timeouts are killed; N is every mutant, "no tests" ones included."""
    killed, n = counts["killed"] + counts["timeout"], sum(counts.values())
    return f"{killed}/{n} killed ({100 * killed / max(n, 1):.1f}%)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(TARGETS), metavar="FILE",
                        help="mutate only this file (repeatable), with its tests; "
                        f"one of: {', '.join(TARGETS)}")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it "
                        "(then `cd DIR && mutmut show NAME` prints a mutant's diff)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--list-survivors", action="store_true")
    args = parser.parse_args(argv)
    if shutil.which("mutmut") is None:
        sys.exit("mutmut is not installed: pip install -e '.[mutation]'")
    mutated = args.only or list(TARGETS)
    tests = list(dict.fromkeys(test for path in mutated for test in TARGETS[path]))
    work = args.keep or Path(tempfile.mkdtemp(prefix="mutation-"))
    if work.exists() and any(work.iterdir()):
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        _prepare(work, mutated, tests)
        started = time.monotonic()
        run = subprocess.run(["mutmut", "run", "--max-children", str(args.max_children)],
                             cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        if run.returncode != 0:  # e.g. a selected test fails on the unmutated code
            sys.stderr.write(run.stdout[-3000:])
            return run.returncode
        _report(_results(work), mutated, time.monotonic() - started, args.list_survivors)
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
