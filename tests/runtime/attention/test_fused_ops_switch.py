"""The fused ops (norm + RoPE + KV write, residual add + norm, router epilogue) run on the Triton
backend, and only there: TritonBackend(fuse_ops=False) / SparseMoe.fuse_router = False give the fast
path as it was before them, with the same outputs (interpreter, fp32)."""

import pytest
import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.torch_backend import TorchBackend
from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.kernels.backend import KernelBackend
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers import attention, mlp, moe, norm
from m3bench.runtime.model import M3ForCausalLM

from .tiny_cfg import tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _counting(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def wrapper(*a, **kw):
        calls[name] = calls.get(name, 0) + 1
        return real(*a, **kw)

    monkeypatch.setattr(module, name, wrapper)


def _forward(backend, fuse_router, monkeypatch, fuse_branches=True):
    calls: dict[str, int] = {}
    _counting(monkeypatch, attention, "norm_rope_write", calls)
    _counting(monkeypatch, attention, "norm_rope_write_pair", calls)
    _counting(monkeypatch, norm, "add_rms_norm_fused", calls)
    _counting(monkeypatch, moe, "router_topk", calls)
    _counting(monkeypatch, mlp, "gated_act", calls)
    m = M3ForCausalLM(tiny_config(), dtype=torch.float32, backend=backend)
    m.init_dummy(5)
    m.layers[1].mlp.kernel_backend = KernelBackend.TRITON
    m.layers[1].mlp.fuse_router = fuse_router
    m.layers[1].attn.fuse_branches = fuse_branches
    kv = KVCache(m.cfg, 6, 16, KVDtype.AUTO, torch.float32)
    meta = build_attn_metadata([37, 1], [37, 20], [[0, 2, 4], [1, 3]], 16)
    ids = torch.randint(0, m.cfg.vocab_size, (38,), generator=torch.Generator().manual_seed(2))
    out = m(ids, meta.positions, meta, kv)
    monkeypatch.undo()
    return out, calls


def test_fused_ops_run_on_the_triton_backend_only(monkeypatch):
    fused, n_fused = _forward(TritonBackend(), True, monkeypatch)
    plain, n_plain = _forward(TritonBackend(fuse_ops=False), False, monkeypatch)
    ref, n_ref = _forward(TorchBackend(), False, monkeypatch)
    apart, n_apart = _forward(TritonBackend(), True, monkeypatch, fuse_branches=False)
    # 2 layers: norm/RoPE launches dense 1, MSA 1 for both branches (2 apart), 4 add + norm (2 a layer), 1 router
    fused_act = {"gated_act": 1}  # the dense layer's activation
    assert n_fused == {"norm_rope_write": 1, "norm_rope_write_pair": 1, "add_rms_norm_fused": 4, "router_topk": 1,
                       **fused_act}
    assert n_apart == {"norm_rope_write": 3, "add_rms_norm_fused": 4, "router_topk": 1, **fused_act}
    assert torch.equal(fused, apart)
    assert n_plain == {} and n_ref == {}
    assert torch.allclose(fused, plain, atol=1e-5, rtol=1e-5), (fused - plain).abs().max()
    assert torch.allclose(fused, ref, atol=1e-5, rtol=1e-5), (fused - ref).abs().max()
