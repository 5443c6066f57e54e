"""M3ForCausalLM: MiniMax-M3 (dense or MSA attention, dense MLP or MoE per layer) and, as the
degenerate case, Llama / Qwen2 / Qwen3. Tokens of all sequences of a step come flattened.

    model = M3ForCausalLM(cfg, dtype=torch.bfloat16, device="cuda")
    model.load_weights(reader)          # or model.load_canonical(weights) / model.init_dummy(seed)
    M3ForCausalLM(cfg, dtype, device, weights=LinearFormat.MXFP8)   # linear layers and experts kept in MXFP8
    hidden = model(input_ids, positions, meta, kv)     # [T, H], after the final norm
    logits = model.compute_logits(hidden[last_idx])    # [N, V] float32
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from m3bench.runtime.attention import kernel_backend_of
from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.attention.torch_backend import TorchBackend
from m3bench.runtime.config import MlpKind, ModelConfig
from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.kernels.moe_sum import MoeSum, summed
from m3bench.runtime.kv_cache import KVCache
from m3bench.runtime.layers.attention import Attention
from m3bench.runtime.layers.linear import WeightSlot
from m3bench.runtime.layers.mlp import GatedMLP
from m3bench.runtime.layers.moe import SparseMoe
from m3bench.runtime.layers.norm import RMSNorm, neutral_value
from m3bench.runtime.layers.rotary import RotaryEmbedding
from m3bench.runtime.layers.weight_format import LinearFormat, fill_mxfp8, fill_nvfp4, linear_format, mx_loading
from m3bench.runtime.parallel import SINGLE, TPGroup, vocab_parallel_embedding


@dataclass(frozen=True)
class CaptureSpec:
    """Copy the residual stream at the input of `layers` into buffer[:T, i] (Eagle3 features)."""

    layers: tuple[int, ...]
    buffer: torch.Tensor  # [max_tokens, len(layers), H], model dtype, preallocated


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device, tp: TPGroup,
                 ep: TPGroup | None = None):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm, dtype, device)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm, dtype, device)
        self.attn = Attention(cfg, layer, dtype, device, tp)
        act = (cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit)
        if cfg.mlp_kinds[layer] is MlpKind.MOE:
            self.mlp = SparseMoe(cfg.hidden_size, cfg.moe, *act, dtype, device, tp, ep)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.dense_intermediate_size, *act, dtype, device, tp)
        self.mlp_prefix = "moe." if cfg.mlp_kinds[layer] is MlpKind.MOE else "mlp."

    def forward(self, h: torch.Tensor, cos, sin, meta: AttnMetadata, kv: KVCache, backend) -> torch.Tensor:
        h, delta = self.forward_parts(h, self.input_norm(h), cos, sin, meta, kv, backend)
        return h + summed(delta)

    def forward_parts(self, h: torch.Tensor, x: torch.Tensor, cos, sin, meta: AttnMetadata, kv: KVCache,
                      backend) -> tuple[torch.Tensor, torch.Tensor | MoeSum]:
        """h: the residual stream at the layer's input, x: input_norm(h) -> (the stream after attention,
        the MLP's output); the caller adds the two (fused with the next norm on the Triton backend, which also sums
        a fused MoE's partials when the MoE leaves them unsummed: kernels/moe_sum.py)."""
        a = self.attn(x, cos, sin, meta, kv, backend)
        kb = kernel_backend_of(backend)
        x_router = self.mlp.router_input(a, kb) if isinstance(self.mlp, SparseMoe) else None
        h, y = self.post_attn_norm.add_forward(h, a, kb, x_router)  # residual add + norm fused (+ router input)
        if not isinstance(self.mlp, SparseMoe):
            return h, self.mlp(y, kb)  # the dense MLP's activation follows the fused ops too
        return h, self.mlp(y, x_router, defer_sum=True)

    def slots(self, prefix: str) -> list[WeightSlot]:
        return [WeightSlot(f"{prefix}input_norm.weight", self.input_norm.weight, None),
                WeightSlot(f"{prefix}post_attn_norm.weight", self.post_attn_norm.weight, None),
                *self.attn.slots(f"{prefix}attn."), *self.mlp.slots(f"{prefix}{self.mlp_prefix}")]


class M3ForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 tp: TPGroup | None = None, backend=None, weights: LinearFormat = LinearFormat.PLAIN,
                 ep: TPGroup | None = None):
        super().__init__()
        self.cfg, self.dtype, self.device, self.weights = cfg, dtype, torch.device(device), weights
        self.tp = tp or SINGLE
        self.ep = ep or self.tp  # routed experts' ranks (attention DP: ep over all ranks, everything else whole)
        self.backend = backend or TorchBackend()
        vocab_local = self.tp.shard_size(cfg.vocab_size, "vocab_size")  # embedding and lm_head: vocab-parallel
        self.embed_tokens = nn.Parameter(torch.empty(vocab_local, cfg.hidden_size, dtype=dtype, device=device),
                                         requires_grad=False)
        with linear_format(weights):  # embeddings, lm_head, norms and routers stay in the model dtype
            self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, device, self.tp, self.ep)
                                        for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm, dtype, device)
        self.rope = RotaryEmbedding(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling, device)
        self.lm_head = (None if cfg.tie_word_embeddings else
                        nn.Parameter(torch.empty(vocab_local, cfg.hidden_size, dtype=dtype, device=device), False))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata, kv: KVCache,
                capture: CaptureSpec | None = None) -> torch.Tensor:
        """input_ids, positions [T] -> final-normed hidden [T, H]; K/V of the tokens land in kv."""
        h = self.embed(input_ids)
        cos, sin = self.rope.cos_sin(positions)
        if not len(self.layers):
            return self.norm(h)
        fused = kernel_backend_of(self.backend)
        x = self.layers[0].input_norm(h)
        for i, layer in enumerate(self.layers):
            if capture is not None and i in capture.layers:
                capture.buffer[:h.shape[0], capture.layers.index(i)].copy_(h)
            h, delta = layer.forward_parts(h, x, cos, sin, meta, kv, self.backend)
            nxt = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            h, x = nxt.add_forward(h, delta, fused)  # the MLP's residual add fused with the next norm
        return x

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, H]; under TP each rank looks up the ids of its vocab rows, zeros elsewhere, then sums."""
        return vocab_parallel_embedding(input_ids, self.embed_tokens, self.tp)

    def lm_head_weight(self) -> torch.Tensor:
        """This rank's vocab rows of the output projection (the embedding's when tied)."""
        return self.embed_tokens if self.lm_head is None else self.lm_head

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] float32 (fp64 for fp64 models)."""
        logits = F.linear(hidden, self.lm_head_weight())
        return self.tp.all_gather(logits, dim=-1).to(torch.promote_types(logits.dtype, torch.float32))

    def weight_slots(self) -> list[WeightSlot]:
        """Every canonical tensor this rank owns, with where it goes and how it is sharded."""
        out = [WeightSlot("embed_tokens.weight", self.embed_tokens, 0)]
        for i, layer in enumerate(self.layers):
            out += layer.slots(f"layers.{i}.")
        out.append(WeightSlot("norm.weight", self.norm.weight, None))
        if self.lm_head is not None:
            out.append(WeightSlot("lm_head.weight", self.lm_head, 0))
        return out

    @torch.no_grad()
    def load_weights(self, reader) -> None:
        """Fill every parameter through `reader.get(name, dtype=..., shard=...)` (CheckpointReader)."""
        with mx_loading(self):
            self._load_slots(reader)

    def _load_slots(self, reader) -> None:
        for slot in self.weight_slots():
            if slot.scale_2 is not None:  # NVFP4 as stored (other formats are converted once, here)
                data, scale, glob = reader.get_nvfp4(slot.name, shard=self._shard(slot))
                slot.target.copy_(data)
                slot.scale.copy_(scale)
                slot.scale_2.copy_(glob.reshape(()).expand(slot.scale_2.shape))
            elif slot.scale is not None:  # MXFP8 likewise
                data, scale = reader.get_mxfp8(slot.name, shard=self._shard(slot))
                slot.target.copy_(data)
                slot.scale.copy_(scale)
            else:
                slot.target.copy_(reader.get(slot.name, dtype=slot.target.dtype, shard=self._shard(slot)))

    def _shard(self, slot: WeightSlot):
        if slot.shard_dim is None or self.tp.world == 1:
            return None
        from m3bench.runtime.checkpoint import Shard

        piece, pieces = slot.split or (self.tp.rank, self.tp.world)
        return Shard(slot.shard_dim, piece, pieces)

    @torch.no_grad()
    def load_canonical(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Fill every parameter from a dict of canonical names (full, unsharded tensors)."""
        slots = self.weight_slots()
        wanted = {s.name for s in slots}
        others = {n for n in weights if ".moe.experts." in n and n not in wanted} if self.ep.world > 1 else set()
        _check_names(wanted, set(weights) - others, self.cfg.tie_word_embeddings)  # others: other ranks' experts
        with mx_loading(self):
            for slot in self.weight_slots():
                _fill(slot, self._local(weights[slot.name], slot))

    def _local(self, full: torch.Tensor, slot: WeightSlot) -> torch.Tensor:
        if slot.shard_dim is None or self.tp.world == 1:
            return full
        piece, pieces = slot.split or (self.tp.rank, self.tp.world)
        n = full.shape[slot.shard_dim] // pieces
        return full.narrow(slot.shard_dim, piece * n, n)

    @torch.no_grad()
    def init_dummy(self, seed: int = 0) -> None:
        """Random weights for benchmarking: matrices N(0, 1/fan_in), norms near neutral, never zeros."""
        with mx_loading(self):
            if self.ep.world > 1:  # every rank draws each full tensor from its own seed, then keeps its shard
                for slot in self.weight_slots():
                    self._dummy_shard(slot, seed)
                return
            g = torch.Generator(device=self.device).manual_seed(seed)
            for slot in self.weight_slots():
                _dummy_fill(slot, self.cfg, g)

    def _dummy_shard(self, slot: WeightSlot, seed: int) -> None:
        shape = list(canonical_shape(slot))
        if slot.shard_dim is not None:
            shape[slot.shard_dim] *= (slot.split or (0, self.tp.world))[1]
        dtype = slot.target.dtype if slot.scale is None else torch.float32
        full = dummy_tensor(slot.name, tuple(shape), dtype, self.cfg, seed, self.device)
        _fill(slot, self._local(full, slot))


def canonical_shape(slot: WeightSlot) -> tuple[int, ...]:
    """The (dequantized) shape of a slot's tensor: NVFP4 packs two weights a byte."""
    *rows, cols = slot.target.shape
    return (*rows, cols * 2 if slot.scale_2 is not None else cols)


def _fill(slot: WeightSlot, w: torch.Tensor) -> None:
    """Copy w into the slot (quantized to the slot's format when it has scales)."""
    if slot.scale_2 is not None:
        fill_nvfp4(slot.target, slot.scale, slot.scale_2, w)
    elif slot.scale is not None:
        fill_mxfp8(slot.target, slot.scale, w)
    else:
        slot.target.copy_(w)


def dummy_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, cfg: ModelConfig, seed: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """The full canonical tensor `name` as init_dummy draws it under TP (its own generator per name,
    so every rank draws the same values and keeps its shard)."""
    g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    full = torch.empty(shape, dtype=dtype, device=device)
    _dummy_fill(WeightSlot(name, full, None), cfg, g)
    return full


def _dummy_fill(slot: WeightSlot, cfg: ModelConfig, g: torch.Generator) -> None:
    if slot.scale is not None:  # quantized: draw in fp32 at the canonical shape, then quantize
        w = torch.empty(canonical_shape(slot), dtype=torch.float32, device=slot.target.device)
        _dummy_fill(WeightSlot(slot.name, w, None), cfg, g)
        _fill(slot, w)
        return
    t = slot.target
    if slot.name.endswith("norm.weight"):
        t.normal_(0.0, 0.05, generator=g).add_(neutral_value(cfg.norm))
    elif t.dim() == 1:  # biases (qkv, router correction)
        t.normal_(0.0, 0.02, generator=g)
    else:
        t.normal_(0.0, t.shape[-1] ** -0.5, generator=g)


def _check_names(wanted: set[str], given: set[str], tied: bool) -> None:
    missing = sorted(wanted - given)
    extra = sorted(given - wanted - ({"lm_head.weight"} if tied else set()))
    if missing or extra:
        raise CheckpointError(f"canonical weights: missing {missing[:5]} ({len(missing)}), "
                              f"unexpected {extra[:5]} ({len(extra)})")
