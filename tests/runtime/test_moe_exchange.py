"""The attention-DP expert exchange (layers/moe_exchange.py) on two gloo ranks in one process (threads): each
rank's own tokens get the MoE output of the whole block (float64, fresh random weights and inputs), also when
the ranks run different numbers of forwards in one step; without the exchange a rank misses the other's experts."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from m3bench.runtime.config import Activation, MoeConfig
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.layers.moe_exchange import install_exchange
from m3bench.runtime.parallel import TPGroup

F64 = torch.float64
M = MoeConfig(num_experts=6, top_k=2, intermediate_size=8, shared_intermediate_size=4, routed_scaling_factor=2.0,
              use_routing_bias=True)
H = 16


def _full_moe(seed: int, dtype: torch.dtype = F64) -> SparseMoe:
    moe = SparseMoe(H, M, Activation.SWIGLUOAI, 1.702, 7.0, dtype, "cpu")
    g = torch.Generator().manual_seed(seed)
    for p in moe.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g, dtype=F64))
    return moe


def _rank_moe(full: SparseMoe, ep: TPGroup) -> SparseMoe:
    """This rank's block: router and shared expert whole, experts [r E/N, (r+1) E/N)."""
    moe = SparseMoe(H, M, Activation.SWIGLUOAI, 1.702, 7.0, full.dtype, "cpu", ep=ep)
    first, n = ep.expert_range(M.num_experts)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            src = dict(full.named_parameters())[name]
            p.copy_(src[first:first + n] if name.startswith("w_") else src)
    return moe


def _on_two_ranks(tmp_path, work) -> list:
    """work(rank, ep, control) on two threads joined by standalone gloo groups; their results in rank order."""
    store = dist.FileStore(str(tmp_path / "store"), 2)
    out, errors = [None, None], []

    def run(rank: int) -> None:
        try:
            model = dist.ProcessGroupGloo(dist.PrefixStore("model", store), rank, 2, timedelta(seconds=60))
            control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, 2, timedelta(seconds=60))
            out[rank] = work(rank, TPGroup(rank, 2, model), control)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("forwards", [(1, 1), (2, 0)])  # (2, 0): rank 1 ran nothing, it serves rank 0 twice
def test_each_rank_gets_the_whole_blocks_output(tmp_path, forwards):
    """A "forward" through two MoE blocks (the counts gathered at the first serve both)."""
    full = [_full_moe(seed=1), _full_moe(seed=11)]
    g = torch.Generator().manual_seed(2)
    inputs = [[torch.randn(n, H, generator=g, dtype=F64) for n in (5, 2)[:forwards[0]]],
              [torch.randn(3, H, generator=g, dtype=F64)][:forwards[1]]]

    def work(rank, ep, control):
        layers = torch.nn.ModuleList([_rank_moe(f, ep) for f in full])
        exchange = install_exchange(layers, ep, control)
        ys = [layers[1](layers[0](x)) for x in inputs[rank]]
        exchange.finish_tick()
        return ys, exchange.exchanges

    results = _on_two_ranks(tmp_path, work)
    for rank, (ys, _) in enumerate(results):
        for x, y in zip(inputs[rank], ys, strict=True):
            assert torch.allclose(y, full[1](full[0](x)), atol=1e-10)
    assert results[0][1] == results[1][1] == 2 * max(forwards)  # the idle rank joined every exchange


def test_bf16_tokens_carry_their_fp32_routing(tmp_path):
    """bf16 tokens, fp32 routing bit-cast into the same rows: each rank's output is the whole block's (bf16
    rounding of the two partial sums aside)."""
    full = _full_moe(seed=8, dtype=torch.bfloat16)
    xs = [torch.randn(n, H, generator=torch.Generator().manual_seed(9 + n)).bfloat16() for n in (6, 3)]

    def work(rank, ep, control):
        moe = _rank_moe(full, ep)
        exchange = install_exchange(torch.nn.ModuleList([moe]), ep, control)
        y = moe(xs[rank])
        exchange.finish_tick()
        return y

    for x, y in zip(xs, _on_two_ranks(tmp_path, work)):
        want = full(x).float()
        assert y.dtype == torch.bfloat16 and torch.allclose(y.float(), want, atol=0.05 * want.abs().max().item())


def test_without_the_exchange_a_rank_misses_the_other_ranks_experts(tmp_path):
    full = _full_moe(seed=3)
    x = torch.randn(6, H, generator=torch.Generator().manual_seed(4), dtype=F64)
    ys = _on_two_ranks(tmp_path, lambda rank, ep, control: _rank_moe(full, ep)(x))
    assert all(not torch.allclose(y, full(x), atol=1e-3) for y in ys)


def test_a_moe_layer_out_of_order_is_a_lock_step_error():
    """A forward must pass the MoE layers in order (each exchanges with the counts its first layer gathered)."""
    layers = torch.nn.ModuleList([_rank_moe(_full_moe(seed=5), TPGroup(1, 2)), _rank_moe(_full_moe(seed=6), TPGroup(1, 2))])
    install_exchange(layers, TPGroup(1, 2), control=None)
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(7), dtype=F64)
    with pytest.raises(RuntimeError, match="MoE layer 1 ran where layer 0 was due"):
        layers[1](x)  # (no collective is reached: the check comes first)
