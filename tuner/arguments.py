"""Argument parsing for `python -m tuner` (sweep, report, bench)."""
from __future__ import annotations

import argparse

from loadtests.workloads import WORKLOAD_NAMES
from tuner.measure.capacity import SUSTAIN_SECONDS

DEFAULT_STORAGE = "sqlite:///tuner-out/tuner.db"
# Defaults sized for the embedded tiny model on 2 CPU cores: a sweep in about 4 minutes
# (4 search trials, then baseline + 1 candidate over 3 interleaved rounds: 10 engines
# of ~23 s each). Real tuning wants more: --trials 30 --remeasure 2 --confirm-rounds 5.
DEFAULT_TRIALS = 4
# --objective capacity: simulated settings (seconds each). 16 left TPE six guided points
# after its ten random ones: SmolLM2's agentic sweep at 16 simulated no speculative setting
# with a small batch and kept a 1.24x one; at 48 its best were suffix:8 with 6-12 sequences
# at 2.0x the defaults (docs/benchmarks/tuning.md, 2026-12-05)
DEFAULT_SIM_TRIALS = 48
DEFAULT_DURATION = 10.0
DEFAULT_REMEASURE = 1
DEFAULT_CONFIRM_ROUNDS = 3
# Without --model (or with builtin://default) the engine serves its embedded tiny model on
# CPU: shorter prompts and outputs, half the users and a small CPU memory budget, so a
# sweep takes minutes on 2 cores. A CPU decode step takes ~0.1 s at a few sequences, so
# the SLOs are scaled x3 (else no setting meets them and goodput cannot rank settings).
# Its 2048-token context caps max_num_batched_tokens' useful range.
TINY_PROFILE = {"length_scale": 0.25, "users_factor": 0.5, "cpu_memory_gib": 0.5,
                "slo_scale": 3.0, "space": ["max_num_batched_tokens=256..2048:log"]}
TINY_MODELS = (None, "builtin://default")
# Real built-in models served on CPU (no CUDA): lengths, users and SLOs from a short
# measurement on 2 shared cores (docs/benchmarks/tuning.md); on a GPU they run
# unscaled. One engine thread: Locust shares the cores (two threads ran ~4x slower there).
CPU_MODEL_PROFILES = {
    "builtin://smollm2-135m-instruct": {"length_scale": 0.25, "users_factor": 0.5,
                                        "slo_scale": 3.0, "cpu_threads": 1},
}


def build_parser(more=()) -> argparse.ArgumentParser:
    """`more`: functions adding subcommands (tuner.sim.cli.add_parsers), called first."""
    parser = argparse.ArgumentParser(prog="python -m tuner",
                                     description="Autotune the paged-KV engine for a workload.")
    sub = parser.add_subparsers(dest="command", required=True)

    for add in more:
        add(sub)

    sweep = sub.add_parser("sweep", help="search engine settings (or benchmark --target-url)")
    sweep.add_argument("--workload", default=None, choices=WORKLOAD_NAMES,
                       help="a synthetic workload (or --trace / --workload-from-prometheus)")
    sweep.add_argument("--trace", default=None, metavar="FILE",
                       help="replay this trace (JSONL; `python -m tuner trace` makes one from "
                            "the engine's --request-log) at its arrival times")
    sweep.add_argument("--workload-from-prometheus", default=None, metavar="URL",
                       help="fit prompt/output lengths and the arrival rate from the service's "
                            "vllm:request_*_tokens histograms in this Prometheus")
    sweep.add_argument("--window", default="24h",
                       help="--workload-from-prometheus: the window to fit over (e.g. 24h)")
    sweep.add_argument("--workload-selector", default="",
                       help="--workload-from-prometheus: label matchers of the service's "
                            "series, e.g. 'namespace=\"prod\",service=\"my-model\"'")
    sweep.add_argument("--load-workers", type=int, default=1, metavar="N",
                       help="run Locust distributed: a master and N worker processes whose "
                            "samples the master merges (default 1: one process)")
    sweep.add_argument("--capacity", type=int, nargs="?", const=8, default=0, metavar="PROBES",
                       help="after the sweep, search the highest open-loop rate per replica "
                            "that meets the SLOs with the winning settings, in at most PROBES "
                            "loads of --duration (default 8; tuner/measure/capacity.py)")
    sweep.add_argument("--trials", type=int, default=None,
                       help=f"total search trials in the study (default {DEFAULT_TRIALS}; "
                            f"capacity: simulated settings, default {DEFAULT_SIM_TRIALS}; "
                            "with --target-url: repeats, default 1)")
    sweep.add_argument("--duration", type=float, default=DEFAULT_DURATION,
                       help="seconds of load per trial")
    sweep.add_argument("--model", default=None,
                       help="checkpoint directory or builtin://NAME (default: the embedded "
                            "tiny model, builtin://default)")
    sweep.add_argument("--storage", default=DEFAULT_STORAGE,
                       help="Optuna RDB URL: sqlite:///file.db or postgresql://...")
    sweep.add_argument("--study-name", default=None,
                       help="default: <workload>-<objective>-<model name>")
    sweep.add_argument("--out", default=None, help="YAML patch file (default <out-dir>/best.yaml)")
    sweep.add_argument("--out-dir", default=None,
                       help="plots, logs, raw samples (default tuner-out/<study name>)")
    sweep.add_argument("--target-url", default=None,
                       help="benchmark this running server instead of tuning")
    sweep.add_argument("--objective", choices=("capacity", "goodput", "pareto"), default=None,
                       help="capacity (default for this engine): the highest open-loop rate a "
                            "replica serves within the SLOs, searched on the simulator and "
                            "confirmed for real; goodput (default with --engine-cmd or "
                            "--target-url): the fixed load's goodput, every trial real; pareto:"
                            " goodput and tail latency")
    sweep.add_argument("--attainment", type=float, default=0.9,
                       help="capacity: the share of requests that must meet every SLO")
    sweep.add_argument("--sustain", type=float, default=SUSTAIN_SECONDS, metavar="SECONDS",
                       help="capacity (and --capacity): how long a passing rate's queue must "
                            "hold: a probe fails when its later half's median TTFT, grown at "
                            "its pace within the window for this long, passes the SLO "
                            f"(default {SUSTAIN_SECONDS:g}; 0: within the SLO now; "
                            "tuner/measure/capacity.py)")
    sweep.add_argument("--target-rate", type=float, default=None, metavar="REQ_PER_S",
                       help="capacity: also print the replicas this rate needs")
    sweep.add_argument("--sim-duration", type=float, default=None,
                       help="capacity: virtual seconds per simulated load (default: --duration,"
                            " the real loads' window: both sides score the same window)")
    sweep.add_argument("--sim-workers", type=int, default=None, metavar="N",
                       help="capacity: simulated settings at once, each in a process forked "
                            "from the sweep (default: one per usable CPU, at most 8; 1: in "
                            "the sweep's own process)")
    sweep.add_argument("--sim-warmup-requests", type=int, default=None, metavar="N",
                       help="capacity: requests served before each simulated load's scored "
                            "window, its steady state (default 200; 0: a cold engine)")
    sweep.add_argument("--profile", default=None, metavar="FILE",
                       help="capacity: the simulator's step-time profile (default: cached for "
                            "the model and threads, else calibrated first; python -m tuner "
                            "profile)")
    sweep.add_argument("--acceptance", type=float, default=None,
                       help="capacity: every simulated speculative draft accepted at this "
                            "rate (default: each method's drafts and acceptance replayed on "
                            "the model's own replies to the workload)")
    sweep.add_argument("--real-probes", type=int, default=4, metavar="N",
                       help="capacity: real loads per arm and round in the confirmation")
    sweep.add_argument("--front-end-time", action="store_true",
                       help="capacity: measure the time outside the engine's steps on the "
                            "pilot's engine (a light load) and add it to every simulated "
                            "TTFT (off: on 2 CPU cores it measured within the noise of a "
                            "light load's TTFT; docs/benchmarks/tuning.md)")
    sweep.add_argument("--param", action="append", default=[], metavar="NAME=SPEC",
                       help="search-space entry, e.g. max_num_seqs=1..64:log, block_size=pow2:1..256,"
                            " gpu_memory_utilization=0.5..0.9:step=0.1, max_num_batched_tokens=none")
    sweep.add_argument("--space-file", default=None, help="YAML search space (replaces defaults)")
    sweep.add_argument("--wide-block-sizes", action="store_true",
                       help="block_size over the powers of two 1..256 instead of 8..128")
    sweep.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="a setting fixed for every trial (also written to the YAML)")
    sweep.add_argument("--slo", action="append", default=[], metavar="[KIND.]NAME=SECONDS",
                       help="override an SLO threshold (ttft, tpot, e2e), e.g. ttft=0.5")
    sweep.add_argument("--users", type=int, default=None,
                       help="closed-loop concurrency (default: the workload's)")
    sweep.add_argument("--rate", type=float, default=None,
                       help="open loop instead: Poisson arrivals at this many req/s")
    sweep.add_argument("--length-scale", type=float, default=None,
                       help="multiply the workload's prompt/output lengths (default 1; "
                            "0.25 for the embedded tiny model)")
    sweep.add_argument("--eos", choices=("auto", "model", "ignore"), default="auto",
                       help="model: the model's EOS ends replies (max_tokens caps them); "
                            "ignore: replies are exactly the workload's max_tokens (ignore_eos);"
                            " auto (default): model for a real --model, ignore for the embedded "
                            "tiny model, a trace and --target-url")
    sweep.add_argument("--remeasure", type=int, default=DEFAULT_REMEASURE, metavar="K",
                       help="after the search, re-measure the best K settings against the "
                            f"baseline, interleaved (default {DEFAULT_REMEASURE}; 0: search only,"
                            " e.g. for parallel workers)")
    sweep.add_argument("--confirm-rounds", type=int, default=DEFAULT_CONFIRM_ROUNDS, metavar="R",
                       help="interleaved rounds of baseline + candidates (default "
                            f"{DEFAULT_CONFIRM_ROUNDS}; at least 2; more narrows the intervals)")
    sweep.add_argument("--baseline", default=None, metavar="FILE",
                       help="YAML with the current spec.engine settings (default: the engine's"
                            " defaults)")
    sweep.add_argument("--min-gain", type=float, default=1.0,
                       help="apply a candidate only when its gain's 95%% lower bound exceeds "
                            "this (default 1)")
    sweep.add_argument("--prometheus", default=None, metavar="URL",
                       help="read server figures with PromQL from this Prometheus instead of "
                            "scraping /metrics")
    sweep.add_argument("--prometheus-selector", default='instance="{instance}"',
                       help="label matchers selecting a trial's engine in Prometheus "
                            "({instance} = the engine's HOST:PORT)")
    sweep.add_argument("--prometheus-targets-dir", default=None, metavar="DIR",
                       help="write each trial's engine as a file_sd target here (a folder "
                            "the Prometheus watches)")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--engine-cmd", default=None,
                       help="command that starts a server (default: python -m engine serve)")
    sweep.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                       help="extra engine argument, verbatim (repeat; e.g. --engine-arg=--cpu-memory-gib=0.1)")
    sweep.add_argument("--cpu-memory-gib", type=float, default=None,
                       help="CPU 'device memory' for the engine (its memory fraction applies "
                            "to it; default 0.2 for the embedded tiny model, else the engine's)")
    sweep.add_argument("--startup-timeout", type=float, default=300.0)
    sweep.add_argument("--warmup-requests", type=int, default=2)
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")

    report = sub.add_parser("report", help="re-print table, YAML and plots from storage")
    report.add_argument("--storage", default=DEFAULT_STORAGE)
    report.add_argument("--study-name", default=None, help="default: the only study in storage")
    report.add_argument("--out", default=None)
    report.add_argument("--out-dir", default=None)
    report.add_argument("--top", type=int, default=5)

    trace = sub.add_parser("trace", help="turn the engine's --request-log into a trace")
    trace.add_argument("logs", nargs="+", metavar="LOG", help="request log(s), one per replica")
    trace.add_argument("-o", "--out", required=True, help="trace file to write (JSONL)")
    trace.add_argument("--min-group", type=int, default=2,
                       help="requests sharing a prefix hash form a group from this many on")
    return parser


def parse_slos(items: list[str], defaults: dict[str, dict[str, float]]) -> dict:
    """Apply `[KIND.]NAME=SECONDS` overrides; ValueError naming the bad item."""
    slos = {kind: dict(values) for kind, values in defaults.items()}
    for item in items:
        key, sep, value = item.partition("=")
        kind, dot, name = key.rpartition(".")
        kinds = [kind] if dot else list(slos)
        if not sep or name not in ("ttft", "tpot", "e2e") or any(k not in slos for k in kinds):
            raise ValueError(f"--slo {item!r}: expected [KIND.]NAME=SECONDS with NAME in "
                             f"ttft, tpot, e2e and KIND in {', '.join(slos)}")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"--slo {item!r}: {value!r} is not a number of seconds") from None
        if seconds <= 0:
            raise ValueError(f"--slo {item!r}: the threshold must be positive")
        for k in kinds:
            slos[k][name] = seconds
    return slos
