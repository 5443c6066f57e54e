"""Starting, watching and stopping the worker processes of ranks 1..N-1.

Rendezvous is a file in a fresh temporary directory (`file://` init: no port to collide on).
Workers ignore Ctrl-C (rank 0 stops them), exit when rank 0's process disappears, and write their
traceback to the run directory, so rank 0 can say why a step failed.

    pool = WorkerPool.spawn(world=2, spec=spec)      # rank 0 then joins pool.init_method
    pool.dead()                                      # [(rank, exit code)] of workers that exited
    pool.stop(graceful=True)                         # join, then terminate, then kill
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m3bench.runtime.distributed.groups import RankGroups, init_groups, rank_device
from m3bench.runtime.distributed.worker import WorkerSpec, spawned_main

JOIN_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 3.0
WATCH_POLL_S = 0.2
START_TIMEOUT_S = 120.0  # spawning a worker imports torch and m3bench
DEATH_GRACE_S = 3.0  # after a failed collective, how long a dying worker gets to show its exit code


@dataclass
class WorkerPool:
    run_dir: Path
    procs: list[Any]  # multiprocessing.Process of ranks 1..N-1
    on_death: Callable[[], None] | None = None  # called once, from the watch thread, when a worker dies
    _stopping: bool = field(default=False, init=False)

    @property
    def init_method(self) -> str:
        return f"file://{self.run_dir / 'rendezvous'}"

    @classmethod
    def spawn(cls, world: int, spec: WorkerSpec, serve_fn: Callable | None = None) -> WorkerPool:
        """Start ranks 1..world-1; each runs `serve_fn(spec, groups)` (default: worker.serve, the TP worker)."""
        import torch.multiprocessing as mp

        run_dir = Path(tempfile.mkdtemp(prefix="m3bench-tp-"))
        ctx = mp.get_context("spawn")
        init = f"file://{run_dir / 'rendezvous'}"
        procs = [ctx.Process(target=spawned_main, args=(r, world, init, spec, str(run_dir), os.getpid(), serve_fn),
                             name=f"m3bench-tp-rank{r}", daemon=True) for r in range(1, world)]
        for p in procs:
            p.start()
        pool = cls(run_dir, procs)
        threading.Thread(target=pool._watch, name="m3bench-tp-watch", daemon=True).start()
        return pool

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every worker is about to join the rendezvous; a worker that died first is an error."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            death = self.describe_death(grace_s=0.0)
            if death is not None:
                hint = "" if ": " in death else (" (spawned workers re-import the main module: a script must "
                                                 "start the LLM under `if __name__ == '__main__':`)")
                raise RuntimeError(f"{death} while starting{hint}")
            if all((self.run_dir / f"worker{r}.ready").exists() for r in range(1, len(self.procs) + 1)):
                return
            time.sleep(0.05)
        raise RuntimeError(f"tensor-parallel workers did not start within {timeout_s:.0f} s")

    def dead(self) -> list[tuple[int, int]]:
        """(rank, exit code) of every worker that has exited."""
        return [(r, p.exitcode) for r, p in enumerate(self.procs, start=1) if p.exitcode is not None]

    def wait_for_death(self, timeout_s: float = DEATH_GRACE_S) -> list[tuple[int, int]]:
        deadline = time.monotonic() + timeout_s
        while not self.dead() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.dead()

    def error_text(self, rank: int) -> str | None:
        """The last line of a worker's traceback, when it wrote one."""
        path = self.run_dir / f"worker{rank}.err"
        lines = path.read_text().strip().splitlines() if path.exists() else []
        return lines[-1] if lines else None

    def describe_death(self, grace_s: float = DEATH_GRACE_S) -> str | None:
        dead = self.wait_for_death(grace_s)
        if not dead:
            return None
        rank, code = dead[0]
        why = self.error_text(rank)
        return (f"tensor-parallel worker rank {rank} (pid {self.procs[rank - 1].pid}) exited with code {code}"
                + (f": {why}" if why else ""))

    def stop(self, graceful: bool) -> None:
        """Wait for the workers (after STOP) when graceful, then terminate / kill what is left."""
        self._stopping = True
        if graceful:
            _join_all(self.procs, JOIN_TIMEOUT_S)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        _join_all(self.procs, KILL_TIMEOUT_S)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _watch(self) -> None:
        while not self._stopping:
            if self.dead():
                if self.on_death is not None and not self._stopping:
                    self.on_death()
                return
            time.sleep(WATCH_POLL_S)


def spawn_ranks(world: int, spec: Any, serve_fn: Callable | None = None) -> tuple[RankGroups, WorkerPool]:
    """Spawn ranks 1..world-1 (each runs serve_fn(spec, groups)) and join them as rank 0: (rank 0's groups, the pool)."""
    pool = WorkerPool.spawn(world, spec, serve_fn)
    try:
        pool.wait_ready()
        return init_groups(0, world, pool.init_method, rank_device(spec.device, 0)), pool
    except BaseException:
        pool.stop(graceful=False)
        raise


def _join_all(procs: list[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
