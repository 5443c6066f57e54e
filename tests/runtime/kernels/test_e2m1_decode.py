"""The kernels decode NVFP4 nibbles by moving them into fp8 e4m3 codes (values / 64) and letting the
fp8 conversion do the rest: exact for all 16 codes (interpreter)."""

import pytest
import torch

from m3bench.runtime.kernels import kv_quant as kq

triton = pytest.importorskip("triton")
tl = triton.language

from m3bench.runtime.kernels.kv_tiles_triton import e2m1_to_f32  # noqa: E402  (after the interpreter is set)


@triton.jit
def _decode_kernel(code_ptr, out_ptr):
    i = tl.arange(0, 16)
    tl.store(out_ptr + i, e2m1_to_f32(tl.load(code_ptr + i)))


def test_e2m1_decode_through_e4m3_is_exact_for_every_code(triton_interpreter):
    out = torch.full((16,), float("nan"))
    _decode_kernel[(1,)](torch.arange(16, dtype=torch.int32), out)
    assert torch.equal(out, kq.e2m1_table())
