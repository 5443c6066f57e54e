"""Triton KV write (interpreter) stores exactly the bytes of the torch writer, only at its slots."""

import pytest
import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.kv_write import write_pages, write_pages_ref

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _cache(fmt, shape, g):
    """A cache filled with random old contents (so untouched slots can be checked)."""
    x = torch.randn(*shape, generator=g) * 2
    if fmt is kq.KVFormat.NVFP4:
        gs = torch.tensor([0.004])
        return kq.Nvfp4Pages(*kq.quantize_nvfp4(x, gs), gs)
    return kq.quantize_fp8(x) if fmt is kq.KVFormat.FP8 else x


def _clone(cache):
    if isinstance(cache, kq.Nvfp4Pages):
        return kq.Nvfp4Pages(cache.data.clone(), cache.scales.clone(), cache.global_scale)
    return cache.clone()


def _bytes(cache):
    if isinstance(cache, kq.Nvfp4Pages):
        return torch.cat([cache.data.flatten(), cache.scales.view(torch.uint8).flatten()])
    return cache.view(torch.uint8).flatten() if cache.dtype == torch.float8_e4m3fn else cache.flatten()


@pytest.mark.parametrize("fmt", list(kq.KVFormat))
@pytest.mark.parametrize("per_head", [True, False])
def test_triton_write_matches_torch_bytes(fmt, per_head):
    g = torch.Generator().manual_seed(40)
    shape = (5, 2, 16, 32) if per_head else (5, 16, 32)
    cache = _cache(fmt, shape, g)
    x = torch.randn(6, 2, 32, generator=g) * 3 if per_head else torch.randn(6, 32, generator=g)
    x[0, ..., :16] = 0.0  # an all-zero NVFP4 group
    x[1, ..., 0] = 1000.0  # saturates fp8 (and an NVFP4 scale)
    slots = torch.tensor([3, 17, -1, 40, 79, 0])
    want, got = _clone(cache), _clone(cache)
    write_pages_ref(want, x, slots)
    write_pages(got, x, slots, backend=KernelBackend.TRITON)
    assert torch.equal(_bytes(got), _bytes(want))
    assert not torch.equal(_bytes(got), _bytes(cache)), "nothing was written"


def test_fp8_rounding_matches_torch_on_every_midpoint():
    # All finite positive e4m3 values, the midpoints between neighbours (ties to even), and
    # log-uniform random magnitudes from 2^-12 to 2^9, with both signs.
    vals = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    mids = (vals[1:] + vals[:-1]) / 2
    g = torch.Generator().manual_seed(41)
    rnd = torch.exp2(torch.rand(640, generator=g, dtype=torch.float64) * 21 - 12)
    x = torch.cat([vals, mids, rnd]).float()
    x = torch.cat([x, -x])
    x = torch.cat([x, x.new_zeros((-x.numel()) % 32)]).view(-1, 32)
    cache = torch.zeros(x.shape[0], 1, 32, dtype=torch.float8_e4m3fn)
    want = cache.clone()
    slots = torch.arange(x.shape[0])
    write_pages(cache, x, slots, backend=KernelBackend.TRITON)
    write_pages_ref(want, x, slots)
    assert torch.equal(cache.view(torch.uint8), want.view(torch.uint8))
