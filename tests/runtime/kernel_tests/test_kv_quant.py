"""FP8 and NVFP4 KV formats: exact codes on hand-made inputs, error bounds on random data."""

import torch

from m3bench.runtime.kernels import kv_quant as kq


def test_fp8_exact_values_and_saturation():
    x = torch.tensor([1.0, 448.0, 500.0, -1000.0, 0.1, 2.0**-9, 17.0, -3.25])
    got = kq.dequantize_fp8(kq.quantize_fp8(x), torch.float32)
    want = torch.tensor([1.0, 448.0, 448.0, -448.0, 0.1015625, 2.0**-9, 16.0, -3.25])
    assert kq.quantize_fp8(x).dtype == torch.float8_e4m3fn
    assert torch.equal(got, want)


def test_fp8_round_trip_bound():
    # e4m3: 3 mantissa bits -> relative error <= 2^-4 on normals, absolute <= 2^-10 below 2^-6.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=g, dtype=torch.float64) * 20
    err = (kq.dequantize_fp8(kq.quantize_fp8(x), torch.float64) - x).abs()
    assert (err <= torch.clamp(x.abs() / 16, min=2.0**-10)).all()


HAND_BLOCK = [6, -3, 0.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -6, 1.5, 4, 0, -0.5, 2]
# ties round to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
HAND_BYTES = [0xD7, 0x01, 0x22, 0x44, 0x66, 0x3F, 0x06, 0x49]
HAND_VALUES = [6, -3, 0.5, 0, 1, 1, 2, 2, 4, 4, -6, 1.5, 4, 0, -0.5, 2]


def test_nvfp4_exact_codes_and_scales():
    block = torch.tensor(HAND_BLOCK)
    x = torch.stack([block, block * 0.5])  # second row: amax 3, global 0.25 -> scale 2
    data, scales = kq.quantize_nvfp4(x, 0.25)
    assert data.dtype == torch.uint8 and scales.dtype == torch.float8_e4m3fn
    assert data.tolist() == [HAND_BYTES, HAND_BYTES]
    assert scales.float().flatten().tolist() == [4.0, 2.0]
    back = kq.dequantize_nvfp4(data, scales, 0.25, torch.float32)
    want = torch.tensor(HAND_VALUES, dtype=torch.float32)
    assert torch.equal(back, torch.stack([want, want * 0.5]))


def test_nvfp4_round_trip_bound():
    # Per element: |err| <= step/4 where |x| <= 2 step, step/2 where <= 4 step, else step,
    # step = e4m3(amax/6/gs) * gs (the E2M1 gaps are 0.5, 1, 2; clamping at 6 step costs
    # at most amax/16 < step).  On Gaussian data the relative RMS error stays below 12%.
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 4, 128, generator=g, dtype=torch.float64) * 3
    gs = kq.nvfp4_global_scale(x.abs().amax())
    data, scales = kq.quantize_nvfp4(x, gs)
    assert data.shape == (8, 4, 64) and scales.shape == (8, 4, 8)
    back = kq.dequantize_nvfp4(data, scales, gs, torch.float64)
    step = (scales.double() * gs.double()).repeat_interleave(16, dim=-1)
    ratio = x.abs() / step
    bound = step * torch.where(ratio <= 2, 0.25, torch.where(ratio <= 4, 0.5, 1.0))
    assert ((back - x).abs() <= bound * (1 + 1e-6)).all()
    rel_rms = (back - x).norm() / x.norm()
    assert 0.01 < rel_rms < 0.12


def test_nvfp4_zero_block_and_global_scale():
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(3))
    x[0, :16] = 0.0  # an all-zero block dequantizes to exact zeros
    gs = kq.nvfp4_global_scale(x.abs().amax())
    assert torch.isclose(gs, x.abs().amax() / 2688.0)
    data, scales = kq.quantize_nvfp4(x, gs)
    back = kq.dequantize_nvfp4(data, scales, gs, torch.float32)
    assert torch.equal(back[0, :16], torch.zeros(16))
    assert scales.float().max() <= 448.0
