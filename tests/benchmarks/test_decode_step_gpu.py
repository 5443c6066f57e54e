"""On the GPU: the fast path (Triton attention + fused MoE + CUDA graphs) agrees with the torch
paths, via `benchmarks/decode_step.py --check-only` in a fresh process (no TRITON_INTERPRET:
other test directories set it for the CPU interpreter); with programmatic dependent launch as the runtime
chooses it, on, and with the early trigger (`--pdl`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_step.py"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("pdl", [None, "on", "early"])  # None: the runtime's default PDL mode
def test_fast_path_checks_pass_on_the_gpu(tmp_path, pdl):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OUT"] = str(tmp_path)
    flags = ["--pdl", pdl] if pdl else []
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check-only", *flags], env=env, capture_output=True,
                          text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "decode_step.json").read_text())
    assert res["checks_ok"] and (pdl is None or res["pdl"] == pdl)
