"""sm90_sass.py tells machine code apart: a kernel moved into an inlined helper gives the same SASS, a changed
operation does not, and the script writes one file a recorded variant (no GPU; a subprocess, without the
interpreter)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def plus_one_kernel(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, tl.load(x_ptr + i) * 2.0 + 1.0)


@triton.jit
def _scaled(v):
    return v * 2.0 + 1.0


@triton.jit
def plus_one_helper_kernel(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, _scaled(tl.load(x_ptr + i)))


@triton.jit
def minus_one_kernel(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, tl.load(x_ptr + i) * 2.0 - 1.0)
'''
DRIVER = '''
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import torch
import tiny_kernels as k
import sm90_sass
x, y = torch.rand(16), torch.empty(16)
out = {fn.__name__: sm90_sass.sass_lines(sm90_sass.sm90_compile.compile_launch(fn, (x, y), {"N": 16}).asm["cubin"])
       for fn in (k.plus_one_kernel, k.plus_one_helper_kernel, k.minus_one_kernel)}
print(json.dumps(out))
'''


def _env():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return env


def _skip_without_ptxas(proc):
    if "ptxas" in proc.stdout + proc.stderr and "not found" in proc.stdout + proc.stderr:
        pytest.skip("no ptxas in this triton install")


def test_the_same_code_through_a_helper_is_the_same_sass_and_a_change_is_not(tmp_path):
    pytest.importorskip("triton")
    (tmp_path / "tiny_kernels.py").write_text(KERNELS)
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), str(HERE)], capture_output=True, text=True,
                          env=_env(), timeout=600, check=False)
    _skip_without_ptxas(proc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sass = json.loads(proc.stdout.splitlines()[-1])
    assert any("STG" in line for line in sass["plus_one_kernel"])  # instructions, not headers
    assert sass["plus_one_helper_kernel"] == sass["plus_one_kernel"]
    assert sass["minus_one_kernel"] != sass["plus_one_kernel"]


@pytest.mark.slow
def test_the_script_writes_a_file_a_variant_and_refuses_unknown_kernels(tmp_path):
    pytest.importorskip("triton")
    script = [sys.executable, str(HERE / "sm90_sass.py")]
    bad = subprocess.run(script + [str(tmp_path / "x"), "no_such_kernel"], capture_output=True, text=True,
                         env=_env(), timeout=600, check=False)
    assert bad.returncode == 2 and "no such kernel: no_such_kernel" in bad.stderr
    proc = subprocess.run(script + [str(tmp_path / "sass"), "router_align_kernel"], capture_output=True, text=True,
                          env=_env(), timeout=900, check=False)
    _skip_without_ptxas(proc)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = sorted((tmp_path / "sass").iterdir())
    assert files and all(f.name.startswith("router_align_kernel-") for f in files)
    assert all("EXIT" in f.read_text() for f in files)
