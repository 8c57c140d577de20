"""A tuner killed with SIGKILL mid-trial takes its engine and Locust along, and the resumed
sweep retries the killed trial once and counts it once.

`python -m tuner sweep` runs on the fake engine in a subprocess; the test kills it while
trial 1's engine and Locust run. Its children are in their own sessions (so nothing but the
kernel's parent-death signal reaches them: tuner.measure.lifeline). Every process the sweep started
carries a tag in its environment; a process with the tag, or with the test's tmp dir in its
command line, still alive after the kill is an orphan.
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.search import study as st

REPO = Path(__file__).resolve().parents[2]
FAKE_ENGINE = f"{sys.executable} {Path(__file__).resolve().parent / 'fake_engine.py'}"
GRACE_S = 2  # the stale-trial grace: a killed trial is stale 2 s after its last heartbeat


def _alive_procs(tag: str, tmp_path: Path) -> dict[int, str]:
    """pid -> command line of the live processes that carry `tag` or name `tmp_path`."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours
            continue
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):  # dead, waiting to be reaped
            continue
        text = cmdline.decode(errors="replace")
        if f"KILL_TEST_TAG={tag}".encode() in environ or str(tmp_path) in text:
            found[int(entry.name)] = text
    return found


def _sweep(tmp_path: Path, tag: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "tuner", "sweep", "--workload", "chat", "--trials", "3",
               "--duration", "2", "--engine-cmd", FAKE_ENGINE,
               "--storage", f"sqlite:///{tmp_path}/s.db", "--out-dir", str(tmp_path / "out"),
               "--users", "2", "--length-scale", "0.1", "--no-progress",
               "--startup-timeout", "30", "--param", "block_size=16",
               "--param", "max_num_seqs=1,2,4,8", "--param", "gpu_memory_utilization=none",
               "--param", "max_num_batched_tokens=none",
               "--param", "num_speculative_tokens=none",
               "--param", "kv_offloading_size=none", "--set", "max_model_len=512",
               "--remeasure", "0", "--seed", "3"]
    env = {**os.environ, "KILL_TEST_TAG": tag, st.STALE_GRACE_ENV: str(GRACE_S),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p)}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_for_trial_1(sweep: subprocess.Popen, tag: str, tmp_path: Path) -> dict[int, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert sweep.poll() is None, sweep.stdout.read().decode()
        procs = {pid: cmd for pid, cmd in _alive_procs(tag, tmp_path).items()
                 if pid != sweep.pid}
        locust = [c for c in procs.values() if "locust" in c and "trial-0001" in c]
        engine = [c for c in procs.values() if "fake_engine.py" in c]
        if locust and engine:
            return procs
        time.sleep(0.1)
    raise AssertionError("trial 1's engine and Locust never ran together")


def test_sigkilled_sweep_leaves_no_orphans_and_resumes_without_double_counting(tmp_path):
    tag = uuid.uuid4().hex
    sweep = _sweep(tmp_path, tag)
    try:
        children = _wait_for_trial_1(sweep, tag, tmp_path)
        time.sleep(0.5)  # well inside the load
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(timeout=10)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    killed_at = time.monotonic()
    left = _alive_procs(tag, tmp_path)
    while left and time.monotonic() - killed_at < 5:
        time.sleep(0.1)
        left = _alive_procs(tag, tmp_path)
    for pid in left:  # don't leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"orphans of the killed tuner (children were {children}): {left}"

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.load_study(study_name="chat-goodput-default", storage=storage)
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.RUNNING], states
    killed_params = study.trials[1].params

    time.sleep(max(0.0, GRACE_S + 0.5 - (time.monotonic() - killed_at)))
    resumed = _sweep(tmp_path, tag)
    out, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, out.decode()
    assert not _alive_procs(tag, tmp_path)

    study = optuna.load_study(study_name="chat-goodput-default", storage=storage)
    trials = study.get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [t.number for t in failed] == [1]  # the killed trial, failed as stale
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == 1]
    assert len(retries) == 1 and retries[0].params == killed_params
    assert retries[0].state == TrialState.COMPLETE
    # --trials 3 means three measured trials: the killed one is replaced, not counted
    measured = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) == 3 and len(trials) == 4
    assert st.search_trials_done(study) == 3
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
