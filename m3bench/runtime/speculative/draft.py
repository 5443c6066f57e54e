"""The Eagle3 draft model (`LlamaForCausalLMEagle3`): one decoder layer over [embedding, feature].

    draft = Eagle3Draft(EagleConfig.from_pretrained(d), dtype=torch.bfloat16, device="cuda")
    draft.load_weights(d)                                   # or draft.init_dummy(seed)
    draft.bind_target(target_embed_weight, target_lm_head_weight)
    feat = draft.combine_features(captured)                 # [T, n, Ht] target residuals -> [T, H]
    out = draft(input_ids, positions, feat, meta, kv)       # DraftOutput(hidden [T, H], feature [T, H])
    ids = draft.to_target_ids(draft.compute_logits(out.hidden[idx]).argmax(-1))

One step, per token (public Eagle3 definition; TensorRT-LLM / vLLM agree):
    x = cat(input_layernorm(embed(tok)), hidden_norm(f)); r = f + o_proj(attn(x))
    s = r + mlp(post_attention_layernorm(r)); hidden = norm(s)
logits = lm_head(hidden); the next step's feature is `hidden` with norm_output, else `s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.attention.torch_backend import TorchBackend
from m3bench.runtime.config import Activation, NormKind
from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Segment, WeightSlot
from m3bench.runtime.layers.mlp import GatedMLP
from m3bench.runtime.layers.norm import RMSNorm
from m3bench.runtime.layers.rotary import RotaryEmbedding, apply_rope
from m3bench.runtime.parallel import SINGLE, TPGroup, vocab_parallel_embedding
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.speculative.config import EagleConfig
from m3bench.runtime.speculative.tiny_draft import write_tiny_draft  # noqa: F401  (re-export)
from m3bench.runtime.speculative.weights import canonical_draft_tensors, check_draft_tensors


@dataclass(frozen=True)
class DraftOutput:
    hidden: torch.Tensor  # [T, H] post-norm: feed to compute_logits
    feature: torch.Tensor  # [T, H] the next draft step's feature input


def _norm(cfg: EagleConfig, dim: int, dtype: torch.dtype, device) -> RMSNorm:
    return RMSNorm(dim, cfg.rms_norm_eps, NormKind.PLAIN, dtype, device)


class Eagle3Attention(nn.Module):
    """GQA attention whose q/k/v read the 2H concatenation; full NeoX RoPE; column/row parallel."""

    def __init__(self, cfg: EagleConfig, dtype: torch.dtype, device, tp: TPGroup, backend):
        super().__init__()
        segs = (Segment("q_proj", cfg.q_size), Segment("k_proj", cfg.kv_size), Segment("v_proj", cfg.kv_size))
        self.qkv = ColumnParallelLinear(2 * cfg.hidden_size, segs, False, dtype, device, tp)
        self.o = RowParallelLinear(cfg.q_size, cfg.hidden_size, "o_proj", False, dtype, device, tp)
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.backend = backend  # `dense(layer, q, meta, kv, scale)`, as for the target's dense layers

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttnMetadata,
                kv: DraftKV) -> torch.Tensor:
        q, k, v = self.qkv.split(self.qkv(x))
        t, d = x.shape[0], self.head_dim
        q = apply_rope(q.view(t, -1, d), cos, sin)
        kv.write(0, apply_rope(k.view(t, -1, d), cos, sin), v.view(t, -1, d), None, meta.slot_mapping)
        return self.o(self.backend.dense(0, q, meta, kv, self.scale).reshape(t, -1))

    def slots(self, prefix: str) -> list[WeightSlot]:
        return self.qkv.slots(prefix) + self.o.slots(prefix)


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: EagleConfig, dtype: torch.dtype, device, tp: TPGroup, backend):
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = _norm(cfg, h, dtype, device)
        self.hidden_norm = _norm(cfg, h, dtype, device)
        self.post_attention_layernorm = _norm(cfg, h, dtype, device)
        self.self_attn = Eagle3Attention(cfg, dtype, device, tp, backend)
        self.mlp = GatedMLP(h, cfg.intermediate_size, Activation.SILU, 0.0, 0.0, dtype, device, tp)

    def forward(self, embeds: torch.Tensor, feature: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttnMetadata, kv: DraftKV) -> torch.Tensor:
        """Returns s = r + mlp(norm(r)), r = feature + attn(...): the pre-norm residual sum."""
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(feature)), dim=-1)
        r = feature + self.self_attn(x, cos, sin, meta, kv)
        return r + self.mlp(self.post_attention_layernorm(r))

    def slots(self, prefix: str) -> list[WeightSlot]:
        norms = [WeightSlot(f"{prefix}{n}.weight", getattr(self, n).weight, None)
                 for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")]
        return norms + self.self_attn.slots(f"{prefix}self_attn.") + self.mlp.slots(f"{prefix}mlp.")


class Eagle3Draft(nn.Module):
    """Draft head; `embed_tokens` always, and `lm_head` when the checkpoint has none, come from the target."""

    def __init__(self, cfg: EagleConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 tp: TPGroup = SINGLE, backend=None):
        super().__init__()
        self.cfg, self.dtype, self.tp = cfg, dtype, tp
        n, ht = cfg.num_aux_layers, cfg.target_hidden_size
        self.fc = ColumnParallelLinear(n * ht, (Segment("fc", cfg.hidden_size, sharded=False),), False, dtype, device)
        self.fc_norm = nn.ModuleList(_norm(cfg, ht, dtype, device) for _ in range(n)) if cfg.fc_norm else None
        self.layer = Eagle3Layer(cfg, dtype, device, tp, backend or TorchBackend())
        self.norm = _norm(cfg, cfg.hidden_size, dtype, device)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, None, device)
        self.lm_head: torch.Tensor | None = None  # [Vd, H]: own (loaded) or the target's (bind_target)
        self.embed_tokens: torch.Tensor | None = None  # [V, H], the target's (this rank's V / world rows under TP)
        self.d2t: torch.Tensor | None = None  # [Vd] int64 offsets: target id = draft id + d2t[draft id]
        self._own_lm_head = False

    # ---- weights -------------------------------------------------------------------------------
    def slots(self) -> list[WeightSlot]:
        """Every parameter under its canonical draft name (see speculative/weights.py)."""
        out = self.fc.slots("")
        if self.fc_norm is not None:
            out += [WeightSlot(f"fc_norm.{i}.weight", m.weight, None) for i, m in enumerate(self.fc_norm)]
        return out + self.layer.slots("layers.0.") + [WeightSlot("norm.weight", self.norm.weight, None)]

    @torch.no_grad()
    def load_weights(self, source: Path | str | Mapping[str, torch.Tensor]) -> None:
        """Load a draft checkpoint dir (or a name -> tensor map); either name scheme; strict."""
        tensors = canonical_draft_tensors(source)
        check_draft_tensors(self.cfg, tensors)
        for slot in self.slots():
            slot.target.copy_(self._local(tensors[slot.name], slot))
        if "lm_head.weight" in tensors:
            self.lm_head = tensors["lm_head.weight"].to(self.dtype).to(self.fc.weight.device)
            self._own_lm_head = True
        if "d2t" in tensors:
            self.d2t = tensors["d2t"].to(torch.int64).to(self.fc.weight.device)

    def _local(self, full: torch.Tensor, slot: WeightSlot) -> torch.Tensor:
        if slot.shard_dim is None or self.tp.world == 1:
            return full
        size = slot.target.shape[slot.shard_dim]
        return full.narrow(slot.shard_dim, self.tp.rank * size, size)

    @torch.no_grad()
    def init_dummy(self, seed: int) -> None:
        """Random weights (norms near 1, linears ~ 1/sqrt(fan_in)) from a local generator."""
        g = torch.Generator().manual_seed(seed)
        for slot in self.slots():
            t = slot.target
            if t.dim() == 1:
                val = 1.0 + 0.1 * torch.randn(t.shape, generator=g)
            else:
                val = torch.randn(t.shape, generator=g) / t.shape[1] ** 0.5
            t.copy_(val.to(t.dtype))

    def bind_target(self, embed_tokens: torch.Tensor, lm_head: torch.Tensor | None) -> None:
        """Share the target's [V, H] embedding (`M3ForCausalLM.embed_tokens`: this rank's V / world rows
        under TP, looked up vocab-parallel), and its lm_head (`M3ForCausalLM.lm_head_weight()`,
        this rank's V / world rows under TP) when the draft ships none."""
        c = self.cfg
        if tuple(embed_tokens.shape) != (c.vocab_size // self.tp.world, c.hidden_size):  # vocab-parallel
            raise CheckpointError(f"target embed_tokens {tuple(embed_tokens.shape)} does not fit the draft "
                                  f"({c.vocab_size}, {c.hidden_size})")
        self.embed_tokens = embed_tokens
        if self._own_lm_head:
            return
        local = (c.vocab_size // self.tp.world, c.hidden_size)
        if lm_head is None or c.has_vocab_map or tuple(lm_head.shape) != local:
            raise CheckpointError("the draft has no lm_head and the target's cannot serve its vocabulary")
        self.lm_head = lm_head

    # ---- forward -------------------------------------------------------------------------------
    def combine_features(self, captured: torch.Tensor) -> torch.Tensor:
        """[T, n, Ht] target residuals (capture-layer order) -> [T, H] = fc(cat(fc_norm_i(f_i)))."""
        if captured.dim() != 3 or captured.shape[1:] != (self.cfg.num_aux_layers, self.cfg.target_hidden_size):
            raise ValueError(f"captured features must be [T, {self.cfg.num_aux_layers}, "
                             f"{self.cfg.target_hidden_size}], got {tuple(captured.shape)}")
        x = captured.to(self.dtype)
        if self.fc_norm is not None:
            x = torch.stack([norm(x[:, i]) for i, norm in enumerate(self.fc_norm)], dim=1)
        return self.fc(x.flatten(1))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, feature: torch.Tensor,
                meta: AttnMetadata, kv: DraftKV) -> DraftOutput:
        """input_ids/positions [T], feature [T, H] -> DraftOutput; writes the tokens' K/V into kv."""
        if self.embed_tokens is None:
            raise RuntimeError("call bind_target(embed_tokens, lm_head) before running the draft")
        embeds = vocab_parallel_embedding(input_ids, self.embed_tokens, self.tp).to(self.dtype)
        cos, sin = self.rope.cos_sin(positions)
        s = self.layer(embeds, feature.to(self.dtype), cos, sin, meta, kv)
        hidden = self.norm(s)
        return DraftOutput(hidden=hidden, feature=hidden if self.cfg.norm_output else s)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [N, draft_vocab] float32 (fp64 for an fp64 draft)."""
        if self.lm_head is None:
            raise RuntimeError("no lm_head: load the draft's or bind the target's first")
        logits = F.linear(hidden, self.lm_head)
        if not self._own_lm_head:  # the target's vocab-parallel rows
            logits = self.tp.all_gather(logits, dim=-1)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (identity when the vocabularies agree)."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def probs_to_target(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """[..., Vd] draft-vocabulary probabilities -> [..., V] (zero outside the draft vocabulary)."""
        if self.d2t is None:
            return draft_probs
        out = draft_probs.new_zeros(*draft_probs.shape[:-1], self.cfg.vocab_size)
        ids = torch.arange(self.cfg.draft_vocab_size, device=draft_probs.device)
        return out.index_copy_(-1, self.to_target_ids(ids), draft_probs)
