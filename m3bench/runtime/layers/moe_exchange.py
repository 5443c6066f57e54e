"""Expert parallelism under attention data parallelism: each rank's routed tokens reach the experts' owners
and come back, with every rank joining every MoE layer's exchange in lock-step.

    exchange = install_exchange(model, ep=TPGroup(rank, world, model_group), control=gloo_group)
    hidden = model(...)            # each MoE layer calls exchange.dispatch (SparseMoe.exchange)
    exchange.finish_tick()         # after the rank's engine step: serve the others' layers until all are done

Under attention DP every rank holds different tokens (its own requests) and runs attention with all heads;
rank r owns the routed experts [r E/N, (r+1) E/N). A MoE layer routes its own tokens (the router is
replicated), then all-gathers tokens and routing over the ranks (padded to the largest rank's count),
runs its experts on every rank's tokens, and sums the partial outputs back to their owners: a
reduce-scatter on NCCL, an all-reduce and a slice on gloo (which has no reduce-scatter). Padding rows
route to expert id E, which no rank owns.

Lock-step: before each exchange the ranks all-gather (tokens, MoE layer, state) on the gloo control group
(host integers: no device sync). A rank whose engine step ran no forward, or fewer forwards than another,
calls `finish_tick`: it announces DONE and joins each exchange the working ranks start, with no tokens of
its own, until every rank is done. So a rank with no requests still serves its experts, and ranks may run
any number of forwards per step.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import torch

from m3bench.runtime.parallel import TPGroup


class RankState(IntEnum):
    DONE = 0  # this rank's step is over: it only serves the others' exchanges
    WORKING = 1  # in a forward, at the MoE layer given


class ExpertExchange:
    """The exchange of one rank; `layers` are the model's MoE blocks in forward order."""

    def __init__(self, ep: TPGroup, control: Any, layers: list[Any]) -> None:
        self.ep, self.control, self.layers = ep, control, layers
        self.slot = {id(m): i for i, m in enumerate(layers)}
        self.exchanges = 0  # exchanges this rank took part in (tests, timing)

    def dispatch(self, moe: Any, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' output [T, H] of this rank's tokens x [T, H] (weights w, global ids [T, k])."""
        counts = self._announce(x.shape[0], self.slot[id(moe)], RankState.WORKING)
        return self._exchange(moe, x, w, ids, counts)

    def finish_tick(self) -> None:
        """Serve the other ranks' exchanges until every rank has finished its step."""
        while True:
            meta = self._gather_meta(0, -1, RankState.DONE)
            working = meta[meta[:, 2] == RankState.WORKING]
            if working.shape[0] == 0:
                return
            moe = self.layers[_one_slot(working[:, 1])]
            self._exchange_empty(moe, meta[:, 0].tolist())

    def close(self) -> None:
        """Unhook the MoE blocks (they and the exchange refer to each other: this frees the groups at once)."""
        for m in self.layers:
            m.exchange = None
        self.layers, self.slot = [], {}

    def _announce(self, tokens: int, slot: int, state: RankState) -> list[int]:
        meta = self._gather_meta(tokens, slot, state)
        _one_slot(meta[meta[:, 2] == RankState.WORKING][:, 1])
        return meta[:, 0].tolist()

    def _gather_meta(self, tokens: int, slot: int, state: RankState) -> torch.Tensor:
        """[world, 3] int64: (tokens, MoE layer, state) of every rank."""
        import torch.distributed as dist

        mine = torch.tensor([tokens, slot, int(state)], dtype=torch.int64)
        parts = [torch.empty_like(mine) for _ in range(self.ep.world)]
        dist.all_gather(parts, mine, group=self.control)
        return torch.stack(parts)

    def _exchange_empty(self, moe: Any, counts: list[int]) -> None:
        """Join an exchange with no tokens of this rank (the dtypes are the working ranks')."""
        (h, k), rw = (moe.router_weight.shape[1], moe.m.top_k), moe.router_weight
        x = torch.empty(0, h, dtype=moe.dtype, device=rw.device)
        w = torch.empty(0, k, dtype=rw.dtype, device=rw.device)
        self._exchange(moe, x, w, torch.empty(0, k, dtype=torch.int64, device=rw.device), counts)

    def _exchange(self, moe: Any, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor,
                  counts: list[int]) -> torch.Tensor:
        self.exchanges += 1
        t, t_max = x.shape[0], max(counts)
        if t_max == 0:
            return x.new_zeros(x.shape)
        xs = self.ep.all_gather(_pad(x, t_max, 0.0), dim=0)  # [N * t_max, H]
        rdt = moe.router_weight.dtype  # fp32 (fp64 for fp64 models): ids are exact below 2**24 experts
        routing = torch.cat((w.to(rdt), ids.to(rdt)), dim=1)
        routing = self.ep.all_gather(_pad(routing, t_max, float(moe.m.num_experts)), dim=0)
        k = ids.shape[1]
        w_all, ids_all = routing[:, :k], routing[:, k:].long()
        y = moe.experts(xs, w_all.to(w.dtype), ids_all - moe.first_expert)  # partial: this rank's experts
        return reduce_scatter_rows(y, self.ep, t_max)[:t]


def _pad(x: torch.Tensor, rows: int, value: float) -> torch.Tensor:
    """x [T, ...] padded with `value` to [rows, ...] (padding routes to expert id E: owned by none)."""
    if x.shape[0] == rows:
        return x.contiguous()
    out = x.new_full((rows, *x.shape[1:]), value)
    out[:x.shape[0]] = x
    return out


def _one_slot(slots: torch.Tensor) -> int:
    """The MoE layer every working rank is at (they must agree: a mismatch is a lock-step bug)."""
    values = set(slots.tolist())
    if len(values) > 1:
        raise RuntimeError(f"attention-DP ranks are at different MoE layers {sorted(values)} (lock-step lost)")
    return values.pop() if values else -1


def reduce_scatter_rows(y: torch.Tensor, ep: TPGroup, rows: int) -> torch.Tensor:
    """Rank r's rows [r rows, (r+1) rows) of the sum of y [world * rows, H] over the ranks."""
    import torch.distributed as dist

    if y.is_cuda:
        out = y.new_empty((rows, *y.shape[1:]))
        dist.reduce_scatter_tensor(out, y.contiguous(), group=ep.group)
        return out
    return ep.all_reduce(y.contiguous())[ep.rank * rows:(ep.rank + 1) * rows]  # gloo: no reduce-scatter


def install_exchange(model: Any, ep: TPGroup, control: Any) -> ExpertExchange:
    """Route every MoE block of `model` (built with `ep`: its experts sharded over the ranks) through one exchange."""
    from m3bench.runtime.layers.moe import SparseMoe

    layers = [m for m in model.modules() if isinstance(m, SparseMoe)]
    exchange = ExpertExchange(ep, control, layers)
    for m in layers:
        if m.ep.world != ep.world or m.first_expert != ep.expert_range(m.m.num_experts)[0]:
            raise ValueError("install_exchange needs a model whose experts are sharded over the same ranks")
        m.exchange = exchange
    return exchange
