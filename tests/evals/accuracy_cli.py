"""`m3bench accuracy` run as a real subprocess on the tiny checkpoint (shared by the CLI and resume tests)."""

import os
import sys
from pathlib import Path

from shared_data import SHARED_DATA


def accuracy_cmd(tiny: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "m3bench", "accuracy", "--model", str(tiny), "--model-id", "m3bench/tiny-m3",
            "--out", str(out), "--no-progress", "--device", "cpu", "--dtype", "float32", *extra]


def accuracy_env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "M3BENCH_DATA": str(SHARED_DATA), "OMP_NUM_THREADS": "1",
            "M3BENCH_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1"}
