"""Run the Triton kernels of these tests under the CPU interpreter (machines without CUDA).

triton.jit reads TRITON_INTERPRET when a kernel is decorated, i.e. when a `*_triton.py`
module is first imported; those modules are imported lazily by the wrappers (never by the
model or the KV cache), so setting the variable here, at collection time, is enough even when
torch or triton itself was imported earlier in the same pytest process. On a CUDA machine the
variable is left alone (GPU runs must compile the kernels) and the interpreter tests skip:
there benchmarks/kernels_gpu.py checks the kernels against the same references.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def triton_interpreter():
    """Skip unless triton is installed and the interpreter is on."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CUDA machine: kernels are checked by benchmarks/kernels_gpu.py")
    return True
