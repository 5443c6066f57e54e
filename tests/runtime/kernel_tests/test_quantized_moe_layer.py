"""The MoE layer's fused path (Triton, interpreter) on MXFP8 / NVFP4 experts as loaded from a checkpoint
equals its torch path: the layer hands the kernel the right views of its stacked weights and scales; at decode
each format runs the kernels measured fastest for it (MXFP8: the first generation with its own tiles, aligned by
the router's kernel; NVFP4: the tile-dequantizing kernels)."""

import pytest
import torch

from m3bench.runtime.kernels import moe_quant
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kernels.moe import mx_moe_tiles
from m3bench.runtime.layers import moe as moe_layer
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.llm import LLM
from m3bench.runtime.tiny import Layout, TinySpec, write_tiny_checkpoint
from m3bench.runtime.tiny_quant import TinyQuant

pytestmark = pytest.mark.usefixtures("triton_interpreter")
SPEC = TinySpec(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                rotary_dim=8, dense_intermediate_size=64, num_experts=4, top_k=2, intermediate_size=32,
                shared_intermediate_size=32, index_dim=16, block_size=16, max_position_embeddings=512)


@pytest.mark.parametrize("quant", [TinyQuant.MXFP8, TinyQuant.NVFP4])
def test_fused_experts_equal_torch_experts(tmp_path, quant):
    path = write_tiny_checkpoint(tmp_path / quant.value, seed=2, layout=Layout.VL, spec=SPEC, weights=quant)
    llm = LLM(path, num_kv_blocks=8, tokens_per_block=16)
    moe = next(m for m in llm.model.modules() if isinstance(m, SparseMoe))
    assert moe.w_down.dtype == (torch.uint8 if quant is TinyQuant.NVFP4 else torch.float8_e4m3fn)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    w, ids = torch.rand(5, 2) + 0.1, torch.tensor([[0, 1], [2, 3], [1, 3], [0, 2], [3, 0]])
    moe.kernel_backend = KernelBackend.TRITON
    fused = moe.experts(x, w, ids)
    torch_path = moe.torch_experts(x, w, ids)
    assert torch.allclose(fused, torch_path, atol=1e-4 * torch_path.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("quant", [TinyQuant.MXFP8, TinyQuant.NVFP4])
def test_decode_runs_each_format_on_its_kernels(tmp_path, monkeypatch, quant):
    path = write_tiny_checkpoint(tmp_path / quant.value, seed=3, layout=Layout.VL, spec=SPEC, weights=quant)
    llm = LLM(path, num_kv_blocks=8, tokens_per_block=16)
    moe = next(m for m in llm.model.modules() if isinstance(m, SparseMoe))
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    want = moe(x)  # the torch path (CPU: the kernel backend resolves to torch)
    seen = {"tiles": [], "quant": 0}
    real_fused, real_quant = moe_layer.fused_moe, moe_quant.fused_moe_quant

    def fused(*args, **kwargs):
        seen["tiles"].append(kwargs.get("tiles"))
        return real_fused(*args, **kwargs)

    def tile_dequantizing(*args, **kwargs):
        seen["quant"] += 1
        return real_quant(*args, **kwargs)

    monkeypatch.setattr(moe_layer, "fused_moe", fused)
    monkeypatch.setattr(moe_quant, "fused_moe_quant", tile_dequantizing)
    moe.kernel_backend = KernelBackend.TRITON
    got = moe(x)
    if quant is TinyQuant.MXFP8:  # aligned by the router's kernel, on MXFP8's tiles
        assert moe.align_fusable(x) and seen["quant"] == 0
        assert seen["tiles"] == [mx_moe_tiles(2 * SPEC.top_k, SPEC.num_experts, SPEC.intermediate_size, 64)]
    else:  # the router's top-k alone, then the tile-dequantizing kernels (fused_moe picks them: no tiles named)
        assert not moe.align_fusable(x) and seen["quant"] == 1 and seen["tiles"] == [None]
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)


def test_nvfp4_codes_held_as_e4m3_decode_like_packed(tmp_path, monkeypatch):
    """NV_CODES E4M3 (M3BENCH_NV_CODES=e4m3): the loaded NVFP4 experts hold their codes as e4m3 bytes, block-major in
    16-wide blocks; the torch path gives the packed experts' result exactly; the fused path at decode runs the
    first-generation kernels on them (FMT 3), aligned by the router's kernel, and matches it; set_nv_codes packs
    them back bit for bit."""
    from m3bench.runtime import nv_codes
    from m3bench.runtime.layers import weight_format as wf

    path = write_tiny_checkpoint(tmp_path / "nv", seed=4, layout=Layout.VL, spec=SPEC, weights=TinyQuant.NVFP4)
    packed = next(m for m in LLM(path, num_kv_blocks=8, tokens_per_block=16).model.modules()
                  if isinstance(m, SparseMoe))
    monkeypatch.setitem(nv_codes.NV_CODES, "codes", wf.NvCodes.E4M3)
    llm = LLM(path, num_kv_blocks=8, tokens_per_block=16)
    moe = next(m for m in llm.model.modules() if isinstance(m, SparseMoe))
    assert moe.w_down.dtype == torch.float8_e4m3fn and moe.w_down.dim() == 4  # [E, H, I/16, 16], block-major
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(5))
    want = packed(x)
    assert torch.equal(moe(x), want)  # the torch path: the same weights to the bit
    seen = []
    real = moe_layer.fused_moe
    monkeypatch.setattr(moe_layer, "fused_moe", lambda *a, **k: seen.append(k.get("tiles")) or real(*a, **k))
    moe.kernel_backend = KernelBackend.TRITON
    got = moe(x)
    assert moe.align_fusable(x) and seen == [mx_moe_tiles(2 * SPEC.top_k, SPEC.num_experts, SPEC.intermediate_size, 64)]
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)
    moe_layers = SPEC.num_layers - SPEC.num_dense_layers
    assert wf.set_nv_codes(llm.model, wf.NvCodes.E4M3, wf.MxLayout.ROW_MAJOR) == 2 * moe_layers  # gate|up, down
    assert moe.w_down.dim() == 3 and wf.set_nv_codes(llm.model, wf.NvCodes.E4M3, wf.MxLayout.ROW_MAJOR) == 0
    assert torch.allclose(moe(x), want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)  # row-major codes run too
    assert wf.set_nv_codes(llm.model, wf.NvCodes.PACKED) == 2 * moe_layers
    assert torch.equal(moe.w_down, packed.w_down) and torch.equal(moe.w_gate_up, packed.w_gate_up)
