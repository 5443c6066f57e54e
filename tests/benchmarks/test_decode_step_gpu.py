"""On the GPU: the fast path (Triton attention + fused MoE + CUDA graphs) agrees with the torch
paths, via `benchmarks/decode_step.py --check-only` in a fresh process (no TRITON_INTERPRET:
other test directories set it for the CPU interpreter)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_step.py"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_fast_path_checks_pass_on_the_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OUT"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check-only"], env=env, capture_output=True,
                          text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "decode_step.json").exists()
