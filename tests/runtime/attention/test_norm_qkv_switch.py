"""Attention.norm_in_qkv: at few rows the residual add + input norm before a layer runs in its q|k|v(|index)
projection's launch (kernels/norm_linear.py), one launch fewer a layer after the first. The model's outputs stay
those of the add + norm then the projection (fp32 to rounding, bf16 within its noise); past the skinny rows, under
a feature capture at that layer, beside the fused heads, the add + norm runs as before, bit for bit (interpreter,
tiny M3: a dense layer, then two MSA + MoE layers, the last feeding the final norm)."""

from collections import Counter

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.kernels import add_norm_triton, norm_linear_triton
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers import attention as attention_layer
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.model import CaptureSpec, M3ForCausalLM

from .tiny_cfg import tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _model(dtype):
    m = M3ForCausalLM(tiny_config(num_layers=3), dtype=dtype, backend=TritonBackend())
    m.init_dummy(9)
    for layer in m.layers:
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.kernel_backend = KernelBackend.TRITON
    return m


def _step(m, n_tok: int, on: bool, monkeypatch, capture: CaptureSpec | None = None):
    """(hidden states of one prefill of n_tok tokens, the launches counted) with the switch on or off."""
    for layer in m.layers:
        layer.attn.norm_in_qkv = on
    launches = recorded_launches(monkeypatch, (add_norm_triton, norm_linear_triton),
                                 ("add_rms_norm_kernel", "norm_dot_kernel"))
    kv = KVCache(m.cfg, 4, 16, KVDtype.AUTO, m.dtype)
    meta = build_attn_metadata([n_tok], [n_tok], [list(range((n_tok + 15) // 16))], 16)
    ids = torch.randint(0, m.cfg.vocab_size, (n_tok,), generator=torch.Generator().manual_seed(n_tok))
    out = m(ids, meta.positions, meta, kv, capture=capture)
    monkeypatch.undo()
    return out, Counter(launches)


@pytest.mark.parametrize("n_tok", [1, 6])
def test_fp32_the_norm_in_the_projection_saves_a_launch_a_layer(monkeypatch, n_tok):
    m = _model(torch.float32)
    apart, n_apart = _step(m, n_tok, False, monkeypatch)
    fused, n_fused = _step(m, n_tok, True, monkeypatch)
    assert "norm_dot_kernel" not in n_apart and n_fused["norm_dot_kernel"] == 2  # layers 1 and 2 (0: no add)
    assert n_fused["add_rms_norm_kernel"] == n_apart["add_rms_norm_kernel"] - 2
    assert torch.isfinite(apart).all() and torch.allclose(fused, apart, atol=2e-5, rtol=2e-5)


def test_bf16_within_its_noise(monkeypatch):
    m = _model(torch.bfloat16)
    apart, _ = _step(m, 1, False, monkeypatch)
    fused, n_fused = _step(m, 1, True, monkeypatch)
    assert n_fused["norm_dot_kernel"] == 2
    scale = apart.float().abs().max()
    assert (fused.float() - apart.float()).abs().max() <= 3e-2 * scale


def test_past_the_skinny_rows_the_add_and_norm_run_as_before(monkeypatch):
    m = _model(torch.float32)
    apart, n_apart = _step(m, 20, False, monkeypatch)
    fused, n_fused = _step(m, 20, True, monkeypatch)
    assert "norm_dot_kernel" not in n_fused and n_fused == n_apart
    assert torch.equal(fused, apart)


def test_a_captured_layer_and_the_fused_heads_keep_the_add_and_norm(monkeypatch):
    """A feature capture copies the stream before its layer (so that layer's add + norm runs first); the fused heads
    (fuse_qkv_heads) take the normed input, not a pending one."""
    m = _model(torch.float32)
    buf = torch.full((1, 1, m.cfg.hidden_size), float("nan"))
    want_buf = buf.clone()
    apart, _ = _step(m, 1, False, monkeypatch, CaptureSpec((2,), want_buf))
    fused, n_fused = _step(m, 1, True, monkeypatch, CaptureSpec((2,), buf))
    assert n_fused["norm_dot_kernel"] == 1  # layer 1 only
    assert torch.isfinite(buf).all() and torch.allclose(buf, want_buf, atol=2e-5, rtol=2e-5)  # layer 1 ran fused
    assert torch.allclose(fused, apart, atol=2e-5, rtol=2e-5)
    for layer in m.layers:
        layer.attn.fuse_qkv_heads = True
    heads, _ = _step(m, 1, False, monkeypatch)
    heads_on, n_heads_on = _step(m, 1, True, monkeypatch)
    assert "norm_dot_kernel" not in n_heads_on and torch.equal(heads_on, heads)


def test_a_stream_left_unwritten_fails_it(monkeypatch):
    """The check above can fail: a projection that does not write the residual stream (h) breaks the outputs."""
    m = _model(torch.float32)
    apart, _ = _step(m, 1, False, monkeypatch)
    real = attention_layer.norm_linear

    def no_stream(residual, delta, norm_weight, eps, gemma, weight, bias=None, h_out=None, tiles=None):
        h, y = real(residual, delta, norm_weight, eps, gemma, weight, bias, tiles=tiles)
        return h_out, y  # h_out left as allocated

    monkeypatch.setattr(attention_layer, "norm_linear", no_stream)
    for layer in m.layers:
        layer.attn.norm_in_qkv = True
    kv = KVCache(m.cfg, 4, 16, KVDtype.AUTO, m.dtype)
    meta = build_attn_metadata([1], [1], [[0]], 16)
    ids = torch.randint(0, m.cfg.vocab_size, (1,), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    broken = m(ids, meta.positions, meta, kv)
    assert not torch.allclose(broken, apart, atol=2e-5, rtol=2e-5)
