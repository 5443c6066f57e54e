"""kernels.moe.ROUTED_GEMV_FMTS in a model: at one token the MoE layers' routed experts run as GEMVs (kernels/moe_gemv.py)
with the router kernel's alignment unused, alone or with their sum in the next add + norm; more tokens run as before
(interpreter, tiny M3: a dense layer, then two MoE layers)."""

from collections import Counter

import pytest
import torch
from launch_counts import recorded_launches

from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.kernels import moe, moe_gemv_triton, moe_triton
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.model import M3ForCausalLM

from .tiny_cfg import prefill_step, tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _forward(m, n_tok: int, gemv: bool, sum_in_norm: bool, monkeypatch):
    for layer in m.layers:
        if isinstance(layer.mlp, SparseMoe):
            layer.mlp.kernel_backend = KernelBackend.TRITON
            layer.mlp.sum_in_norm = sum_in_norm
    monkeypatch.setattr(moe, "ROUTED_GEMV_FMTS", frozenset({0}) if gemv else frozenset())
    counts = recorded_launches(monkeypatch, (moe_triton, moe_gemv_triton))
    out = prefill_step(m, n_tok)
    monkeypatch.undo()
    return out, Counter(counts)


@pytest.mark.parametrize("sum_in_norm", [False, True])
def test_one_token_moe_layers_run_the_gemvs(monkeypatch, sum_in_norm):
    m = M3ForCausalLM(tiny_config(num_layers=3), dtype=torch.float32, backend=TritonBackend())
    m.init_dummy(9)
    dots, n_dots = _forward(m, 1, False, sum_in_norm, monkeypatch)
    gemv, n_gemv = _forward(m, 1, True, sum_in_norm, monkeypatch)
    assert n_dots["moe_gate_up_kernel"] == 2 and "moe_gemv_gate_up_kernel" not in n_dots
    assert n_gemv["moe_gemv_gate_up_kernel"] == n_gemv["moe_gemv_down_kernel"] == 2
    assert "moe_gate_up_kernel" not in n_gemv and "moe_align_kernel" not in n_gemv
    assert n_gemv["moe_sum_kernel"] == n_dots["moe_sum_kernel"] == (0 if sum_in_norm else 2)
    assert torch.isfinite(gemv).all() and torch.allclose(gemv, dots, atol=1e-5, rtol=1e-5)
    _, n_six = _forward(m, 6, True, sum_in_norm, monkeypatch)  # more tokens: the grouped kernels as before
    assert "moe_gemv_gate_up_kernel" not in n_six and n_six["moe_gate_up_kernel"] == 2
