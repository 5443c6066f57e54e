"""`sweep --serve`'s server lives no longer than the sweep: SIGTERM and kill -9 of the parent end it too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DRIVER = """
import os, sys, time
from m3bench.bench.child_process import start_child
child = start_child([sys.executable, "-c", "import time; time.sleep(120)"], dict(os.environ))
print(child.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int, timeout_s: float = 15.0) -> bool:
    """The process ended (a zombie waiting for init to reap it counts as ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_child_dies_with_its_parent(sig):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    child = int(driver.stdout.readline())
    try:
        assert not _gone(child, 0.3) and os.getpgid(child) == child  # running, in its own process group
        driver.send_signal(sig)
        driver.wait(timeout=10)
        assert _gone(child), "the child outlived its parent"
    finally:
        for pid in (child, driver.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_stop_child_ends_the_whole_group():
    from m3bench.bench.child_process import start_child, stop_child

    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
    proc = start_child([sys.executable, "-c", code], dict(os.environ))
    deadline = time.monotonic() + 10
    while not _children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = _children(proc.pid)[0]
    stop_child(proc, grace_s=5)
    assert proc.returncode is not None and _gone(grandchild)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_sweep_serve_killed_takes_its_server_along(tiny_ckpt, tmp_path):
    cmd = [sys.executable, "-m", "m3bench", "sweep", "--serve", "--model", str(tiny_ckpt), "--out", str(tmp_path / "o"),
           "--concurrency", "1", "--isl", "8", "--osl", "512", "--num-prompts", "1000", "--warmup", "0",
           "--num-kv-blocks", "16"]
    sweep = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not _children(sweep.pid) and time.monotonic() < deadline and sweep.poll() is None:
            time.sleep(0.1)
        servers += _children(sweep.pid)
        assert servers, "the sweep started no server"
        time.sleep(1.0)
        sweep.send_signal(signal.SIGKILL)
        sweep.wait(timeout=10)
        assert all(_gone(pid, 30) for pid in servers), "m3bench serve outlived the killed sweep"
    finally:
        for pid in [sweep.pid, *servers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
