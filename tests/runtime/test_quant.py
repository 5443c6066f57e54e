"""MXFP8 / NVFP4 dequantization: hand-made codes and scales, and round trips on random data."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime import quant

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_table_has_the_eight_magnitudes_and_their_negatives():
    t = quant.e2m1_table()
    assert t[:8].tolist() == E2M1
    assert t[8:].tolist() == [-v for v in E2M1]


def test_unpack_e2m1_takes_the_low_nibble_first():
    # byte 0x21: low nibble 1 (0.5), high nibble 2 (1.0); 0xF7: 7 (6.0) then 15 (-6.0); 0x9B: 11 (-1.5), 9 (-0.5)
    packed = torch.tensor([[0x21, 0xF7, 0x9B]], dtype=torch.uint8)
    assert quant.unpack_e2m1(packed).tolist() == [[0.5, 1.0, 6.0, -6.0, -1.5, -0.5]]


def test_e8m0_exponents():
    s = torch.tensor([127, 128, 126, 130, 0, 254, 255], dtype=torch.uint8)
    f = quant.e8m0_to_float(s)
    assert f[:4].tolist() == [1.0, 2.0, 0.5, 8.0]
    assert f[4].item() == 2.0 ** -127 and f[5].item() == 2.0 ** 127
    assert torch.isnan(f[6])


def test_e8m0_dtype_is_accepted_as_raw_bytes():
    if not hasattr(torch, "float8_e8m0fnu"):
        pytest.skip("torch without float8_e8m0fnu")
    s = torch.tensor([125, 129], dtype=torch.uint8)
    assert quant.e8m0_to_float(s.view(torch.float8_e8m0fnu)).tolist() == [0.25, 4.0]


def test_dequant_mxfp8_hand_made():
    vals = torch.tensor([1.0, -2.0, 0.5, 448.0] * 16).reshape(2, 32)  # exactly representable in e4m3
    scale = torch.tensor([[130], [125]], dtype=torch.uint8)  # 2**3 and 2**-2
    w = quant.dequant_mxfp8(vals.to(torch.float8_e4m3fn), scale, torch.float32)
    assert torch.equal(w, vals * torch.tensor([[8.0], [0.25]]))


def test_dequant_nvfp4_hand_made():
    codes = torch.arange(16).repeat(2).reshape(1, 32)  # every code once per 16-block
    packed = quant.pack_e2m1(codes)
    scale = torch.tensor([[2.0, 0.5]]).to(torch.float8_e4m3fn)
    w = quant.dequant_nvfp4(packed, scale, torch.tensor(3.0), torch.float32)
    table = quant.e2m1_table()
    assert torch.equal(w[0, :16], table * 6.0) and torch.equal(w[0, 16:], table * 1.5)


def test_mismatched_scale_shape_is_refused():
    with pytest.raises(ValueError, match="scale shape"):
        quant.dequant_mxfp8(torch.zeros(2, 64).to(torch.float8_e4m3fn), torch.zeros(2, 3, dtype=torch.uint8),
                            torch.float32)


def test_round_to_e2m1_is_nearest_with_ties_to_even():
    x = torch.tensor([0.2, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.8, -100.0])
    got = quant.e2m1_table()[quant.round_to_e2m1_codes(x)]
    assert got.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, -6.0]


@pytest.mark.parametrize("seed", [0, 1])
def test_mxfp8_round_trip(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 128, generator=g) * torch.logspace(-3, 2, 64).unsqueeze(1)
    q, s = quant.quant_mxfp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8 and s.shape == (64, 4)
    back = quant.dequant_mxfp8(q, s, torch.float32)
    # e4m3 keeps 3 mantissa bits: relative error <= 2**-4 of the value for normal numbers,
    # plus e4m3's subnormal spacing 2**-9 times the block scale for tiny values
    block_scale = quant.e8m0_to_float(s).repeat_interleave(32, dim=1)
    assert torch.all((back - w).abs() <= w.abs() * 2 ** -4 + block_scale * 2 ** -9)
    assert torch.equal(quant.dequant_mxfp8(*quant.quant_mxfp8(back), torch.float32), back)  # idempotent


@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_round_trip(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(32, 64, generator=g, dtype=torch.float64).float()
    packed, scale, scale_2 = quant.quant_nvfp4(w)
    assert packed.shape == (32, 32) and scale.shape == (32, 4) and scale_2.shape == ()
    back = quant.dequant_nvfp4(packed, scale, scale_2, torch.float32)
    # reference: each element rounded to the nearest E2M1 grid point of its own block scale
    step = (scale.float() * scale_2).repeat_interleave(16, dim=1)
    grid = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    ref = (step.double().unsqueeze(-1) * grid)
    nearest = ref.gather(-1, (w.double().unsqueeze(-1) - ref).abs().argmin(-1, keepdim=True)).squeeze(-1)
    assert torch.allclose(back.double(), nearest, rtol=0, atol=1e-6 * w.abs().max().item())
    # block amax lands on +-6 * scale up to e4m3 rounding of the scale: relative error of the max < 1/8
    amax = w.abs().unflatten(1, (-1, 16)).amax(-1)
    amax_back = back.abs().unflatten(1, (-1, 16)).amax(-1)
    assert torch.all((amax_back - amax).abs() <= amax / 8)
