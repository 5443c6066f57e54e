"""Bytes and floor arithmetic of one decode step at MiniMax-M3's per-GPU TP8/EP8 shapes
(docs/performance.md): weights read (the local experts some token routed to: counted from the
routing that ran, or expected E_local(1-(1-k/E_total)^B)), KV read (dense layers: the whole
context; MSA layers: top-k pages) and index keys read (the whole context), over `peak_bytes_per_s()` (the
device's copy rate where a GPU run measured it, floor_bandwidth.py; else the H200's 4.3 TB/s); plus how many
layers fit in a memory budget. Pure Python.

Two shape sets: `M3Shapes()` (world 1: 16 experts top-4, every pick local, one index head: the
shapes the 47-layer runs of docs/performance.md used) and `RANK` (one faithful TP8/EP8 rank: the
router over all 128 experts of which the rank owns 16, the 4 KV heads duplicated to 1 per rank,
the index projection replicated: all 4 index heads of 128 computed on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

# The rate every floor reads its bytes at (one definition for all the benchmarks): a GPU run sets its own device's
# copy rate (floor_bandwidth.use_device_bandwidth); the default is the H200's copy rate, measured here in 2026-11.
BANDWIDTH = {"bytes_per_s": 4.3e12, "source": "the H200's copy rate (2026-11), not measured in this run"}
GB = 1e9


def peak_bytes_per_s() -> float:
    return BANDWIDTH["bytes_per_s"]


def peak_source() -> str:
    return BANDWIDTH["source"]


def set_peak_bytes_per_s(rate: float, source: str) -> None:
    BANDWIDTH.update(bytes_per_s=float(rate), source=source)


@dataclass(frozen=True)
class M3Shapes:
    """Per-GPU shapes of MiniMax-M3 under TP8/EP8 (see the module docstring)."""

    hidden: int = 6144
    heads: int = 8
    kv_heads: int = 1
    head_dim: int = 128
    rotary_dim: int = 64
    index_heads: int = 1
    index_dim: int = 128
    experts: int = 16
    top_k: int = 4
    expert_inter: int = 3072
    shared_inter: int = 384
    dense_inter: int = 1536
    dense_layers: int = 3
    vocab: int = 25008
    page: int = 128
    topk_blocks: int = 16
    weight_bytes: int = 2  # bf16
    kv_bytes: int = 1  # fp8 e4m3
    world: int = 1  # TP / EP ranks the full model is spread over; the fields above are one rank's
    global_kv_heads: int = 0  # the full model's KV heads (0: kv_heads * world)

    @property
    def router_experts(self) -> int:
        """Experts the router scores (all of them); `experts` are the ones this rank owns."""
        return self.experts * self.world

    @property
    def full_kv_heads(self) -> int:
        return self.global_kv_heads or self.kv_heads * self.world


TINY = M3Shapes(hidden=64, heads=4, kv_heads=1, head_dim=32, rotary_dim=16, index_heads=1, index_dim=32,
                experts=4, top_k=2, expert_inter=32, shared_inter=16, dense_inter=64, dense_layers=1,
                vocab=256, page=16, topk_blocks=2)

RANK = M3Shapes(index_heads=4, world=8, global_kv_heads=4)
TINY_RANK = M3Shapes(hidden=64, heads=2, kv_heads=1, head_dim=32, rotary_dim=16, index_heads=4, index_dim=32,
                     experts=4, top_k=4, expert_inter=32, shared_inter=16, dense_inter=64, dense_layers=1,
                     vocab=32, page=16, topk_blocks=2, world=8, global_kv_heads=4)


# ---- bytes and floor (pure arithmetic) --------------------------------------------------------

def distinct_experts(E: int, k: int, B: int) -> float:
    """Expected distinct experts hit by B tokens choosing k of E uniformly: E (1 - (1 - k/E)^B)."""
    return E * (1.0 - (1.0 - k / E) ** B)


def expected_local_experts(s: M3Shapes, B: int) -> float:
    """Expected distinct local experts read when B tokens pick top_k of all router_experts
    uniformly: E_local (1 - (1 - k / E_total)^B)."""
    return s.experts * (1.0 - (1.0 - s.top_k / s.router_experts) ** B)


def attn_weight_bytes(s: M3Shapes, sparse: bool) -> int:
    qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
    index = s.index_heads * s.index_dim + s.index_dim if sparse else 0
    norms = 2 * s.head_dim + (2 * s.index_dim if sparse else 0) + 2 * s.hidden
    return ((qkv + index) * s.hidden + s.hidden * s.heads * s.head_dim + norms) * s.weight_bytes


def expert_bytes(s: M3Shapes) -> int:
    return 3 * s.expert_inter * s.hidden * s.weight_bytes


def moe_fixed_bytes(s: M3Shapes) -> int:
    """Router over all experts (fp32 weight + bias) and the shared expert: read every step."""
    return (s.router_experts * s.hidden + s.router_experts) * 4 + 3 * s.shared_inter * s.hidden * s.weight_bytes


def layer_kinds(s: M3Shapes, layers: int) -> list[bool]:
    """True for an MSA + MoE layer, False for a dense one (the first dense_layers)."""
    return [i >= s.dense_layers for i in range(layers)]


def weight_bytes_read(s: M3Shapes, layers: int, B: int, experts_read: list[float] | None = None) -> float:
    """Bytes of weights one decode step of B tokens reads (lm_head whole, B embedding rows);
    experts_read: distinct local experts read per MoE layer (None: the uniform expectation)."""
    total = s.vocab * s.hidden * s.weight_bytes + B * s.hidden * s.weight_bytes + s.hidden * s.weight_bytes
    moe_layers = sum(layer_kinds(s, layers))
    if experts_read is None:
        experts_read = [expected_local_experts(s, B)] * moe_layers
    if len(experts_read) != moe_layers:
        raise ValueError(f"experts_read has {len(experts_read)} entries for {moe_layers} MoE layers")
    reads = iter(experts_read)
    for sparse in layer_kinds(s, layers):
        total += attn_weight_bytes(s, sparse)
        if sparse:
            total += moe_fixed_bytes(s) + next(reads) * expert_bytes(s)
        else:
            total += 3 * s.dense_inter * s.hidden * s.weight_bytes
    return total


def kv_bytes_read(s: M3Shapes, layers: int, B: int, ctx: int) -> int:
    """K/V bytes: dense layers read the whole context; MSA layers at most topk_blocks pages."""
    per_token = 2 * s.kv_heads * s.head_dim * s.kv_bytes
    sparse_tokens = min(ctx, s.topk_blocks * s.page)
    return sum(B * (sparse_tokens if sp else ctx) * per_token for sp in layer_kinds(s, layers))


def index_bytes_read(s: M3Shapes, layers: int, B: int, ctx: int) -> int:
    """The indexer reads every index key of the context on each MSA layer."""
    return sum(B * ctx * s.index_dim * s.kv_bytes for sp in layer_kinds(s, layers) if sp)


@dataclass(frozen=True)
class Floor:
    weights_bytes: float
    kv_bytes: float
    index_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.index_bytes

    @property
    def ms(self) -> float:
        return self.total_bytes / peak_bytes_per_s() * 1e3


def floor_of(s: M3Shapes, layers: int, B: int, ctx: int, experts_read: list[float] | None = None) -> Floor:
    return Floor(weight_bytes_read(s, layers, B, experts_read), kv_bytes_read(s, layers, B, ctx),
                 index_bytes_read(s, layers, B, ctx))


def pages_per_seq(s: M3Shapes, ctx: int) -> int:
    """Pages a sequence needs to hold ctx tokens plus the one this step writes."""
    return -(-(ctx + 1) // s.page)


def total_weight_bytes(s: M3Shapes, layers: int) -> float:
    """Every weight resident on the GPU (embedding and lm_head both, all local experts)."""
    return weight_bytes_read(s, layers, 0, [0.0] * sum(layer_kinds(s, layers))) + s.vocab * s.hidden * s.weight_bytes + sum(
        s.experts * expert_bytes(s) for sp in layer_kinds(s, layers) if sp)


def resident_bytes(s: M3Shapes, layers: int, B: int, ctx: int) -> float:
    """All weights plus the KV pool (one scratch page) for B sequences of ctx tokens."""
    pages = B * pages_per_seq(s, ctx) + 1
    kv = 0
    for sparse in layer_kinds(s, layers):
        kv += pages * s.page * (2 * s.kv_heads * s.head_dim + (s.index_dim if sparse else 0)) * s.kv_bytes
    return total_weight_bytes(s, layers) + kv


def layers_that_fit(s: M3Shapes, B: int, ctx: int, budget_bytes: float, max_layers: int = 60) -> int:
    fits = [n for n in range(1, max_layers + 1) if resident_bytes(s, n, B, ctx) <= budget_bytes]
    return max(fits) if fits else 1
