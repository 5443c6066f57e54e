"""SparseMoe.sum_in_norm: on one rank the fused MoE's final sum runs in the next residual add + norm's launch
(kernels/moe_sum.py). The model's logits keep their bits, and each MoE layer launches one kernel fewer. Under TP,
or through DecoderLayer.forward, the sum keeps its own launch (interpreter, tiny M3: a dense layer, then two MoE
layers, the last feeding the final norm)."""

from collections import Counter

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.kernels import add_norm_triton, moe_triton
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.parallel import TPGroup

from .tiny_cfg import prefill_step, tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _model(dtype):
    m = M3ForCausalLM(tiny_config(num_layers=3), dtype=dtype, backend=TritonBackend())
    m.init_dummy(9)
    for layer in m.layers:
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.kernel_backend = KernelBackend.TRITON
    return m


def _counted(monkeypatch) -> list:
    return recorded_launches(monkeypatch, (moe_triton, add_norm_triton), ("moe_sum_kernel", "moe_gate_up_kernel",
                                                                          "add_rms_norm_kernel",
                                                                          "moe_sum_add_rms_norm_kernel"))


def _forward(m, n_tok, sum_in_norm, monkeypatch):
    for layer in m.layers:
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.sum_in_norm = sum_in_norm
    counts = _counted(monkeypatch)
    out = prefill_step(m, n_tok)
    monkeypatch.undo()
    return out, Counter(counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_tok", [1, 6])  # the shared expert beside (its output the sum's addend) / inside
def test_the_sum_in_the_next_norm_keeps_the_bits_and_saves_a_launch(monkeypatch, dtype, n_tok):
    m = _model(dtype)
    apart, n_apart = _forward(m, n_tok, False, monkeypatch)
    fused, n_fused = _forward(m, n_tok, True, monkeypatch)
    assert n_apart["moe_gate_up_kernel"] == n_fused["moe_gate_up_kernel"] == 2  # both MoE layers ran fused
    assert n_apart["moe_sum_kernel"] == 2 and "moe_sum_kernel" not in n_fused
    assert n_fused["moe_sum_add_rms_norm_kernel"] == 2  # the next layer's input norm and the final norm
    assert n_fused["add_rms_norm_kernel"] == n_apart["add_rms_norm_kernel"] - 2
    assert torch.isfinite(apart).all() and torch.equal(fused, apart)


class _Echo(TPGroup):
    """A two-rank group without a process group: its all-reduce hands the tensor back (what the MoE returns is the
    check)."""

    def all_reduce(self, t):
        return t


def test_the_sum_keeps_its_launch_under_tp_and_in_a_layer_alone(monkeypatch):
    """tp world > 1: the all-reduce sits between the sum and the add + norm, so the MoE sums; DecoderLayer.forward
    (a layer alone) adds a summed output."""
    m = _model(torch.float32)
    moe = m.layers[1].mlp
    moe.sum_in_norm = True
    x = torch.randn(1, m.cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    deferred = moe(x, defer_sum=True)
    assert not isinstance(deferred, torch.Tensor)
    moe.tp = _Echo(rank=0, world=2)
    assert isinstance(moe(x, defer_sum=True), torch.Tensor)
    assert torch.equal(moe(x, defer_sum=True), deferred.summed())
    moe.tp = m.tp
    layer, n_tok = m.layers[1], 1
    kv = KVCache(m.cfg, 4, 16, KVDtype.AUTO, m.dtype)
    meta = build_attn_metadata([n_tok], [n_tok], [[0]], 16)
    cos, sin = m.rope.cos_sin(meta.positions)
    h = torch.randn(n_tok, m.cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    got = layer(h, cos, sin, meta, kv, m.backend)
    moe.sum_in_norm = False
    assert isinstance(got, torch.Tensor) and torch.equal(got, layer(h, cos, sin, meta, kv, m.backend))
