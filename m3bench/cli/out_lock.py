"""One run per output directory: `OUT/.m3bench.lock` held with flock for the run's lifetime.

    with out_lock(opts.out, "accuracy"):
        ...   # a second run on the same --out refuses at once (exit 2) naming the holder

The kernel drops the lock when the holder exits, kill -9 included, so a stale file never blocks a rerun.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from m3bench.cli.errors import M3BenchError

LOCK_NAME = ".m3bench.lock"


@contextmanager
def out_lock(out_dir: Path, command: str) -> Iterator[Path]:
    """Hold OUT's lock (making OUT) or raise M3BenchError when another run holds it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise M3BenchError(f"{out_dir} is in use by another m3bench run ({holder}): wait for it to finish "
                               f"or give another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{command}, pid {os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock
