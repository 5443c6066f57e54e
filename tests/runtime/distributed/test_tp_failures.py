"""Failures at TP 2 on CPU: a worker killed mid-run makes generate fail within seconds with a message
naming it; Ctrl-C and a killed rank 0 leave no worker process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tp_helpers import P, tiny_checkpoint

from m3bench.runtime import LLM, SamplingParams

DRIVER = """
import sys
from m3bench.runtime import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(sys.argv[1], kv_cache_dtype="auto", tokens_per_block=16, tensor_parallel_size=2)
    print(" ".join(str(p.pid) for p in llm._tp.pool.procs), flush=True)
    while True:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=50, ignore_eos=True))
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tp_fail_ckpt"))


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _gone_within(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


def test_worker_killed_mid_generate_fails_within_seconds(ckpt):
    llm = LLM(ckpt, kv_cache_dtype="auto", tokens_per_block=P, tensor_parallel_size=2)
    pid = llm._tp.pool.procs[0].pid
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)

    threading.Timer(0.5, kill).start()
    try:
        with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
            llm.generate([[5, 6, 7]] * 2, SamplingParams(max_tokens=1000, ignore_eos=True))
        assert time.monotonic() - killed_at[0] < 10.0
        with pytest.raises(RuntimeError, match="cannot continue"):  # and stays failed
            llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    finally:
        llm.shutdown()
    assert not _alive(pid)


def _start_driver(ckpt: Path) -> tuple[subprocess.Popen, list[int]]:
    # SIG_DFL: a job started in the background by a shell inherits SIGINT ignored, and Python then installs
    # no KeyboardInterrupt handler; a terminal's foreground job has the default
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(ckpt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, [int(p) for p in line.split()]


def test_ctrl_c_stops_the_workers(ckpt):
    proc, workers = _start_driver(ckpt)
    time.sleep(0.5)  # generating
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # do not leave a generating driver behind when the check fails
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert _gone_within(workers, 5.0)


def test_killed_rank0_takes_its_workers_along(ckpt):
    proc, workers = _start_driver(ckpt)
    time.sleep(0.5)
    proc.kill()  # no chance to clean up: the workers notice their parent is gone
    proc.communicate(timeout=30)
    assert _gone_within(workers, 5.0)


def test_a_failed_start_leaves_no_worker(ckpt):
    """Rank 0 fails after the workers started (a bad kv_cache_dtype): they are stopped with it."""
    import gc
    import multiprocessing

    from m3bench.runtime.errors import InputError

    with pytest.raises(InputError, match="kv_cache_dtype"):
        LLM(ckpt, kv_cache_dtype="int3", tokens_per_block=P, tensor_parallel_size=2)
    gc.collect()
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not multiprocessing.active_children()


def test_a_stop_that_hangs_is_bounded():
    """Driver.shutdown's graceful STOP runs under a deadline: a hung one is reported as such, not waited on."""
    import threading

    from m3bench.runtime.distributed.driver import _within

    never = threading.Event()
    t0 = time.monotonic()
    assert _within(0.2, never.wait) == (False, True) and time.monotonic() - t0 < 2.0
    assert _within(2.0, lambda: None) == (True, False)
    assert _within(2.0, lambda: 1 / 0) == (False, False)
