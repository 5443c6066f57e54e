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

Lock-step: when a forward reaches its first MoE layer the ranks all-gather (tokens, state) on the gloo
control group (host integers: no device sync); every MoE layer of that forward then exchanges with those
counts, in layer order (a layer out of order is an error). A rank whose engine step ran no forward, or fewer
forwards than another, calls `finish_tick`: it announces DONE and, for each forward the working ranks start,
joins every layer's exchange with no tokens of its own, until every rank is done. So a rank with no requests
still serves its experts, and ranks may run any number of forwards per step. Tokens and routing (bit-cast
to the tokens' dtype) travel in one all-gather per layer.
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
        self.counts: list[int] = []  # every rank's tokens in the forward under way
        self.next_slot = 0  # the MoE layer the forward under way reaches next
        self.exchanges = 0  # exchanges this rank took part in (tests, timing)

    def dispatch(self, moe: Any, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' output [T, H] of this rank's tokens x [T, H] (weights w, global ids [T, k])."""
        slot = self.slot[id(moe)]
        if slot != self.next_slot:
            raise RuntimeError(f"MoE layer {slot} ran where layer {self.next_slot} was due (lock-step lost)")
        if slot == 0:  # a forward starts: the ranks' token counts, once per forward
            self.counts = self._gather_meta(x.shape[0], RankState.WORKING)[:, 0].tolist()
        self.next_slot = (slot + 1) % len(self.layers)
        return self._exchange(moe, x, w, ids, self.counts)

    def finish_tick(self) -> None:
        """Serve the other ranks' forwards (every MoE layer, no tokens of this rank) until all ranks are done."""
        while True:
            meta = self._gather_meta(0, RankState.DONE)
            if not bool((meta[:, 1] == RankState.WORKING).any()):
                return
            for moe in self.layers:
                self._exchange_empty(moe, meta[:, 0].tolist())

    def close(self) -> None:
        """Unhook the MoE blocks (they and the exchange refer to each other: this frees the groups at once)."""
        for m in self.layers:
            m.exchange = None
        self.layers, self.slot = [], {}

    def _gather_meta(self, tokens: int, state: RankState) -> torch.Tensor:
        """[world, 2] int64: (tokens, state) of every rank."""
        import torch.distributed as dist

        mine = torch.tensor([tokens, int(state)], dtype=torch.int64)
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
        t, t_max, h, k = x.shape[0], max(counts), x.shape[1], ids.shape[1]
        if t_max == 0:
            return x.new_zeros(x.shape)
        rdt = moe.router_weight.dtype  # fp32 (fp64 for fp64 models): ids are exact below 2**24 experts
        routing = _pad(torch.cat((w.to(rdt), ids.to(rdt)), dim=1), t_max, float(moe.m.num_experts))
        rows = torch.cat((_pad(x, t_max, 0.0), routing.view(x.dtype)), dim=1)  # routing bit-cast: one gather
        everyone = self.ep.all_gather(rows, dim=0)  # [N * t_max, H + routing]
        routing = everyone[:, h:].contiguous().view(rdt)
        ids_all = routing[:, k:].long() - moe.first_expert  # local ids (others' experts fall outside)
        y = moe.experts(everyone[:, :h].contiguous(), routing[:, :k].to(w.dtype), ids_all)  # partial: this rank's
        return reduce_scatter_rows(y, self.ep, t_max)[:t]


def _pad(x: torch.Tensor, rows: int, value: float) -> torch.Tensor:
    """x [T, ...] padded with `value` to [rows, ...] (padding routes to expert id E: owned by none)."""
    if x.shape[0] == rows:
        return x.contiguous()
    out = x.new_full((rows, *x.shape[1:]), value)
    out[:x.shape[0]] = x
    return out


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
