"""Kernels per layer of the rank's decode step, by the torch profiler: one dense layer, one MSA + MoE
layer (each routing) and the head (embedding, logits), each called eagerly `reps` times on decode
inputs of B tokens at context ctx; a layer is its forward plus its residual add fused with the next
norm, as the model runs it. On CUDA: every device kernel's launches and time per call; on CPU (the
smoke run): the top-level torch ops' counts only (times are not meaningful)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from decode_routing import Routing, set_routing
from decode_setup import decode_meta, sync


@dataclass(frozen=True)
class KernelRow:
    name: str
    count: float  # launches per call
    us: float  # device time per call (0 on CPU)


@dataclass(frozen=True)
class PartProfile:
    part: str  # "dense layer", "MSA+MoE layer (realistic)", "head"
    variant: str  # the decode_setup.OpsSet value it ran with ("unfused", "fused-v1", "fused")
    batch: int
    context: int
    kernels: tuple[KernelRow, ...]

    @property
    def launches(self) -> float:
        return sum(k.count for k in self.kernels)

    @property
    def us(self) -> float:
        return sum(k.us for k in self.kernels)


def aggregate(events, cuda: bool, reps: int) -> tuple[KernelRow, ...]:
    """Profiler events -> rows per kernel name (CUDA: device kernels; CPU: top-level ops), per call."""
    from torch.autograd import DeviceType

    agg: dict[str, tuple[int, float]] = {}
    for e in events:
        if (e.device_type == DeviceType.CUDA) if cuda else (e.cpu_parent is None and e.device_type == DeviceType.CPU):
            n, t = agg.get(e.name, (0, 0.0))
            agg[e.name] = (n + 1, t + (e.time_range.elapsed_us() if cuda else 0.0))
    rows = (KernelRow(k, n / reps, t / reps) for k, (n, t) in agg.items())
    return tuple(sorted(rows, key=lambda r: (-r.us, -r.count, r.name)))


@torch.inference_mode()
def profile_calls(fn, dev: torch.device, reps: int) -> tuple[KernelRow, ...]:
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm-up: compiles the Triton kernels outside the profile
    sync(dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        sync(dev)
    return aggregate(prof.events(), dev.type == "cuda", reps)


def profile_rank(model, kv, s, batches, ctx: int, dev: torch.device, reps: int, variant: str = "fused"
                 ) -> list[PartProfile]:
    """Every part at each batch size (model: the rank of decode_step.build_rank, >= 1 MoE layer)."""
    out = []
    moe_layer = s.dense_layers
    for B in batches:
        meta = decode_meta(s, B, ctx, dev)
        ids = torch.randint(0, s.vocab, (B,), generator=torch.Generator().manual_seed(B)).to(dev)
        h = model.embed(ids).contiguous()
        x = model.layers[0].input_norm(h)
        cos, sin = model.rope.cos_sin(meta.positions)
        layer_call = lambda i: lambda: _layer_step(model, i, h, x, cos, sin, meta, kv)  # noqa: E731
        out.append(PartProfile("dense layer", variant, B, ctx, profile_calls(layer_call(0), dev, reps)))
        for routing in Routing:
            set_routing(model, routing)
            kernels = profile_calls(layer_call(moe_layer), dev, reps)
            out.append(PartProfile(f"MSA+MoE layer ({routing.value})", variant, B, ctx, kernels))
        set_routing(model, Routing.REALISTIC)
        head = lambda: model.compute_logits(model.embed(ids))  # noqa: E731  (the final norm: in the last layer's step)
        out.append(PartProfile("head", variant, B, ctx, profile_calls(head, dev, reps)))
    return out


def _layer_step(model, i: int, h, x, cos, sin, meta, kv):
    """What M3ForCausalLM.forward runs per layer: the layer, then its residual add fused with the
    next norm (the final norm's kernel stands in for the next layer's input norm)."""
    from m3bench.runtime.attention import kernel_backend_of

    h, delta = model.layers[i].forward_parts(h, x, cos, sin, meta, kv, model.backend)
    return model.norm.add_forward(h, delta, kernel_backend_of(model.backend))


def profile_lines(parts: list[PartProfile], timed: bool) -> list[str]:
    lines = []
    for p in parts:
        t = f", {p.us:.1f} us" if timed else " (counts only: CPU)"
        what = 'kernel launches' if timed else 'torch ops'
        lines.append(f"profile B={p.batch} ctx={p.context} {p.part} [{p.variant}]: {p.launches:.0f} {what}{t} per call")
        lines.append("  launches   us/call  kernel" if timed else "  calls  op")
        for k in p.kernels:
            lines.append(f"  {k.count:8.1f} {k.us:9.1f}  {k.name[:110]}" if timed else f"  {k.count:5.1f}  {k.name[:110]}")
    return lines


def profile_summary(parts: list[PartProfile], layers: int, dense_layers: int) -> list[str]:
    """One line per (batch, part, ops set): launches and device us per call, and the step they add up
    to (dense layers x dense + the rest x MSA+MoE (realistic) + head)."""
    lines = [f"{'batch':>5} {'ops':>8} {'part':<28} {'launches':>8} {'us':>9}"]
    for p in parts:
        lines.append(f"{p.batch:>5} {p.variant:>8} {p.part:<28} {p.launches:>8.0f} {p.us:>9.1f}")
    for (b, v), ps in _by_batch_variant(parts).items():
        est = dense_layers * ps["dense layer"].us + (layers - dense_layers) * ps["MSA+MoE layer (realistic)"].us
        est += ps["head"].us
        lines.append(f"B={b} {v}: {layers}-layer step from the profile (realistic) {est / 1e3:.3f} ms "
                     f"(eager kernels, no launch gaps)")
    return lines


def _by_batch_variant(parts: list[PartProfile]) -> dict:
    out: dict = {}
    for p in parts:
        out.setdefault((p.batch, p.variant), {})[p.part] = p
    return out
