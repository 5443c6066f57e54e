"""Child processes that live no longer than their parent (the server a sweep starts).

    proc = start_child([sys.executable, "-m", "m3bench", "serve", ...], env)
    stop_child(proc)       # SIGTERM to its process group, SIGKILL after a grace period

The child gets its own process group (stopped as a whole, workers included) and, on Linux, a
parent-death signal (prctl PR_SET_PDEATHSIG): when the parent dies, kill -9 included, the kernel
sends the child SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 20.0


def _die_with(parent_pid: int):
    def preexec() -> None:  # runs in the child between fork and exec
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def start_child(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`cmd` in its own process group, signalled when this process dies; stdout discarded, stderr ours."""
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, process_group=0,
                            preexec_fn=_die_with(os.getpid()))


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_child(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the child's group; SIGKILL it if the child is still up after `grace_s`."""
    if proc.poll() is not None:
        return
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
