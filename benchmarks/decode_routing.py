"""Routing of the benchmark's rank: realistic picks over all experts, or every pick local (the worst
case), and the statistics of the routing one step produced (local picks per token, distinct local
experts read per MoE layer: what the floor of that row counts)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

LOCAL_BIAS = 100.0  # added to the correction bias of the rank's experts: every top-k pick lands there


class Routing(Enum):
    REALISTIC = "realistic"  # the dummy router over all experts as drawn (picks ~uniform)
    ALL_LOCAL = "all-local"  # the rank's experts biased up: every pick local (one EP rank's worst case)


def _moes(model) -> list:
    from m3bench.runtime.layers.moe import SparseMoe

    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, SparseMoe)]


@torch.no_grad()
def set_routing(model, routing: Routing) -> None:
    """Bias the router toward the rank's own experts (ALL_LOCAL) or restore it (REALISTIC)."""
    for moe in _moes(model):
        if moe.router_bias is None:
            raise ValueError("the all-local routing needs a router correction bias")
        if not hasattr(moe, "drawn_bias"):
            moe.drawn_bias = moe.router_bias.detach().clone()
        moe.router_bias.copy_(moe.drawn_bias)
        if routing is Routing.ALL_LOCAL:
            n = moe.w_down.shape[0]
            moe.router_bias[moe.first_expert:moe.first_expert + n] += LOCAL_BIAS


@dataclass(frozen=True)
class RoutingStats:
    local_picks_per_token: float  # mean over MoE layers
    experts_read: tuple[float, ...]  # distinct local experts routed to, per MoE layer

    @property
    def experts_per_layer(self) -> float:
        return sum(self.experts_read) / max(1, len(self.experts_read))


def local_picks(ids: torch.Tensor, first: int, n: int) -> tuple[float, int]:
    """ids [T, k] global expert ids -> (local picks per token, distinct local experts)."""
    local = ids[(ids >= first) & (ids < first + n)]
    return local.numel() / ids.shape[0], int(local.unique().numel())


@torch.inference_mode()
def routing_stats(model, step) -> RoutingStats:
    """Run step() once eagerly, recording every MoE layer's routing of its input."""
    from m3bench.runtime.layers.moe import route

    seen: list[tuple[float, int]] = []

    def hook(moe, args):
        _, ids = route(args[0], moe.router_weight, moe.router_bias, moe.m.top_k, moe.m.routed_scaling_factor)
        seen.append(local_picks(ids, moe.first_expert, moe.w_down.shape[0]))

    handles = [moe.register_forward_pre_hook(hook) for moe in _moes(model)]
    try:
        step()
    finally:
        for h in handles:
            h.remove()
    picks = sum(p for p, _ in seen) / max(1, len(seen))
    return RoutingStats(picks, tuple(float(d) for _, d in seen))
