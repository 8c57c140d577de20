"""Children that die with the tuner: `preexec_fn=die_with_parent()` for subprocess.Popen.

The engine and Locust run in their own sessions (`start_new_session=True`) so that one
`killpg` stops each with everything it started. A session of its own also means a tuner
killed with SIGKILL (OOM killer, `kill -9`, a preempted pod's runtime) takes none of them
along: they would go on holding the GPU and the port, and load the next trial's engine.
On Linux the child asks the kernel for SIGKILL when its parent dies
(`prctl(PR_SET_PDEATHSIG)`, kept across exec); if the parent is already gone by the time
the child gets there, it kills itself. Elsewhere there is no such call: None (no preexec).

The kernel means the parent *thread*: Popen must be called from a thread that outlives the
child (the tuner starts both from its main thread).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _prctl()  # looked up once, in the parent: the forked child only calls it


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get `sig` when this process dies (Linux)."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        if _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return  # not fatal: the child runs, only without the lifeline
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec
