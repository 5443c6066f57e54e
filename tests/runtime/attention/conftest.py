"""Run the Triton attention backend of these tests under the CPU interpreter.

triton.jit reads TRITON_INTERPRET when a `*_triton.py` kernel module is first imported; the
wrappers import those lazily, so setting the variable at collection time is enough.
"""

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def triton_interpreter():
    """Skip the test when triton is not installed."""
    pytest.importorskip("triton")
    return True
