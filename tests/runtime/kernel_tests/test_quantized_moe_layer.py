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
