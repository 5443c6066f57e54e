"""Will the model fit? Weight, workspace and KV bytes per GPU rank, from a ModelConfig alone (no torch).

    s = PlanSettings(tp=8, weights=WeightFormat.MXFP8, kv_cache_dtype="bf16", gpu_memory_gib=141)
    plan = plan_memory(cfg, s)          # MemoryPlan: parts (bytes per rank), kv bytes per token, tokens that fit
    plan.fits, plan.shortfall_bytes, plan.message(), plan.to_dict()
    check_fits(cfg, s)                  # raises InputError(plan.message()) when it does not fit
    parameter_count(cfg)                # {part: parameters of the whole model}

Bytes per rank follow the runtime's sharding (runtime/layers, design.md "Tensor parallelism"): q/o and
MLP intermediates split over TP, KV and index heads split or duplicated (fewer heads than ranks), the
index key head replicated, routed experts expert-parallel (E / EP experts a rank; with EP < TP each further
split by intermediate size over TP / EP ranks: 1/TP of the expert bytes either way), embeddings and
lm_head by vocabulary. Formats: MXFP8 = 1 byte + one E8M0 byte per 32 inputs; NVFP4 = half a byte + one
e4m3 byte per 16 inputs (its codes held as e4m3 bytes, runtime.nv_codes: 1 byte + the same); embeddings,
lm_head, norms and routers (fp32) are never quantized.
The KV cache: pages of `page_tokens` (128 = the MSA block), K and V per layer and the index key per MSA
layer, in the layer's storage format (`kv_cache_dtype` as runtime.kv_cache.KVDtype names it).
The workspace (activations of one `max_num_tokens` step, logits of `max_num_seqs` rows, CUDA context) and
the CUDA-graph reserve are estimates, stated in `PlanSettings` so a user can change them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from pathlib import Path

from m3bench.runtime.config import AttnKind, MlpKind, ModelConfig, QuantMethod
from m3bench.runtime.errors import InputError
from m3bench.runtime.nv_codes import NvCodes, nv_codes

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
GIB = 2 ** 30
MX_BLOCK, NV_BLOCK = 32, 16
DEFAULT_GPU_MEMORY_GIB = 141.0  # an H200
PARTS = ("embeddings", "attention", "index", "dense_mlp", "routed_experts", "shared_expert", "routers_norms",
         "lm_head", "eagle3_draft")


class WeightFormat(Enum):
    BF16 = "bf16"  # every weight in the model dtype (2 bytes: bf16; `dtype_bytes` says otherwise)
    MXFP8 = "mxfp8"  # every linear layer MXFP8
    NVFP4_EXPERTS = "nvfp4-experts"  # routed experts NVFP4, the other linear layers MXFP8 (ModelOpt mixed)
    NVFP4_EXPERTS_E4M3 = "nvfp4-experts-e4m3"  # the same, the experts' codes held as e4m3 bytes (runtime.nv_codes)


class KVFormat(Enum):
    PLAIN = "plain"  # the model dtype (auto) or bf16
    FP8 = "fp8"
    NVFP4 = "nvfp4"


@dataclass(frozen=True)
class DraftShape:
    """An Eagle3 draft layer (shared/docs/minimax-m3.md section 6): bf16, embeddings shared with the target."""

    hidden_size: int = 6144
    num_heads: int = 64
    num_kv_heads: int = 64  # the -GQA variant: 4
    head_dim: int = 128
    intermediate_size: int = 18432
    vocab_size: int = 200064


@dataclass(frozen=True)
class PlanSettings:
    tp: int = 1
    ep: int | None = None  # None: = tp (the runtime's expert parallelism)
    weights: WeightFormat = WeightFormat.BF16
    dtype_bytes: int = 2  # model (compute) dtype: bf16 2, fp32 4
    kv_cache_dtype: str = "auto"  # auto | bf16 | fp8 | nvfp4 | hybrid
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB
    gpu_memory_utilization: float = 0.9  # as LLM(gpu_memory_utilization=...)
    max_model_len: int | None = None  # None: the config's max_position_embeddings
    max_num_seqs: int = 64
    max_num_tokens: int = 2048  # tokens of one step (prefill chunk)
    page_tokens: int = 128
    draft: DraftShape | None = None
    context_reserve_gib: float = 1.0  # CUDA context, NCCL buffers, allocator slack
    cuda_graph_reserve_gib: float = 1.0
    device_name: str = "GPU"
    attention_dp: bool = False  # tp ranks of attention DP: only the routed experts split (over tp), the rest whole

    @property
    def split(self) -> int:
        """Ranks the attention, dense, shared-expert, embedding and lm_head weights and the KV heads split over."""
        return 1 if self.attention_dp else self.tp


@dataclass(frozen=True)
class MemoryPlan:
    settings: PlanSettings
    parts: dict[str, int]  # weight bytes per rank by part
    workspace_bytes: int
    cuda_graph_bytes: int
    kv_bytes_per_token: int  # K + V of every layer (and the draft's), per rank
    index_k_bytes_per_token: int  # MSA index keys, per rank
    page_bytes: int
    budget_bytes: int  # gpu memory x utilization
    max_model_len: int
    kv_pages: int  # pages that fit beside weights and reserves (0 when none)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def weight_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def kv_tokens(self) -> int:
        return self.kv_pages * self.settings.page_tokens

    @property
    def pages_per_sequence(self) -> int:
        return -(-self.max_model_len // self.settings.page_tokens)

    @property
    def sequences(self) -> int:
        """Sequences of max_model_len tokens whose KV fits at once (capped at max_num_seqs)."""
        return min(self.kv_pages // self.pages_per_sequence, self.settings.max_num_seqs)

    @property
    def needed_bytes(self) -> int:
        """Weights, reserves and the KV of one max_model_len sequence."""
        return (self.weight_bytes + self.workspace_bytes + self.cuda_graph_bytes
                + self.pages_per_sequence * self.page_bytes)

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.budget_bytes

    @property
    def shortfall_bytes(self) -> int:
        return max(self.needed_bytes - self.budget_bytes, 0)

    def message(self) -> str:
        s = self.settings
        layout = f"attention DP {s.tp}/EP{s.tp}" if s.attention_dp else f"TP{s.tp}/EP{s.ep or s.tp}"
        head = (f"memory plan per rank at {layout}, weights {s.weights.value}, "
                f"KV {s.kv_cache_dtype}, {s.gpu_memory_gib:g} GiB x {s.gpu_memory_utilization:g}: "
                f"weights {self.weight_bytes / GIB:.2f} GiB + workspace {self.workspace_bytes / GIB:.2f} GiB "
                f"+ CUDA graphs {self.cuda_graph_bytes / GIB:.2f} GiB")
        if self.fits:
            return (f"{head}; KV room {self.kv_tokens} tokens, {self.sequences} sequences of {self.max_model_len}: "
                    "fits")
        return (f"{head} + one {self.max_model_len}-token sequence's KV "
                f"{self.pages_per_sequence * self.page_bytes / GIB:.2f} GiB: does not fit by "
                f"{self.shortfall_bytes / GIB:.2f} GiB")

    def to_dict(self) -> dict:
        s = self.settings
        return {
            "tp": s.tp, "ep": s.ep or s.tp, "attention_dp": s.attention_dp, "weights": s.weights.value, "kv_cache_dtype": s.kv_cache_dtype,
            "gpu_memory_gib": s.gpu_memory_gib, "gpu_memory_utilization": s.gpu_memory_utilization,
            "budget_bytes": self.budget_bytes, "weight_bytes": self.weight_bytes,
            "weight_bytes_by_part": dict(self.parts), "workspace_bytes": self.workspace_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes, "page_tokens": s.page_tokens,
            "kv_bytes_per_token": self.kv_bytes_per_token, "index_k_bytes_per_token": self.index_k_bytes_per_token,
            "page_bytes": self.page_bytes, "kv_pages": self.kv_pages, "kv_tokens": self.kv_tokens,
            "max_model_len": self.max_model_len, "max_num_seqs": s.max_num_seqs, "sequences": self.sequences,
            "needed_bytes": self.needed_bytes, "fits": self.fits, "shortfall_bytes": self.shortfall_bytes,
            "message": self.message(),
        }


# --- parameters ----------------------------------------------------------------------------------

def _mlp_params(hidden: int, inter: int) -> int:
    return 3 * hidden * inter


def parameter_count(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of the whole model by part (no draft)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out = dict.fromkeys(PARTS, 0)
    out["embeddings"] = v * h
    out["lm_head"] = 0 if cfg.tie_word_embeddings else v * h
    out["routers_norms"] = h
    for i in range(cfg.num_layers):
        _layer_params(cfg, i, out)
    return out


def _layer_params(cfg: ModelConfig, i: int, out: dict[str, int]) -> None:
    h = cfg.hidden_size
    out["attention"] += 2 * h * cfg.q_size + 2 * h * cfg.kv_size + (cfg.q_size + 2 * cfg.kv_size) * cfg.qkv_bias
    out["routers_norms"] += 2 * h + 2 * cfg.head_dim * cfg.qk_norm
    if cfg.attn_kinds[i] is AttnKind.MSA:
        m = cfg.msa
        out["index"] += (m.index_heads + 1) * m.index_dim * h
        out["routers_norms"] += 2 * m.index_dim
    if cfg.mlp_kinds[i] is MlpKind.DENSE:
        out["dense_mlp"] += _mlp_params(h, cfg.dense_intermediate_size)
        return
    e = cfg.moe
    out["routed_experts"] += e.num_experts * _mlp_params(h, e.intermediate_size)
    out["shared_expert"] += _mlp_params(h, e.shared_intermediate_size)
    out["routers_norms"] += e.num_experts * (h + e.use_routing_bias)


# --- bytes per rank ------------------------------------------------------------------------------

def _linear_bytes(params: float, fmt: str, dtype_bytes: int) -> float:
    """Bytes of `params` linear-layer weights stored in fmt ("plain" | "mxfp8" | "nvfp4" | "nvfp4-e4m3": the codes as
    e4m3 bytes)."""
    if fmt == "mxfp8":
        return params * (1 + 1 / MX_BLOCK)
    if fmt == "nvfp4":
        return params * (0.5 + 1 / NV_BLOCK)
    if fmt == "nvfp4-e4m3":
        return params * (1 + 1 / NV_BLOCK)
    return params * dtype_bytes


def _formats(w: WeightFormat) -> tuple[str, str]:
    """(format of the linear layers, format of the routed experts)."""
    return {WeightFormat.BF16: ("plain", "plain"), WeightFormat.MXFP8: ("mxfp8", "mxfp8"),
            WeightFormat.NVFP4_EXPERTS: ("mxfp8", "nvfp4"), WeightFormat.NVFP4_EXPERTS_E4M3: ("mxfp8", "nvfp4-e4m3")}[w]


def _local_heads(heads: int, tp: int) -> int:
    """Heads a rank holds: heads / tp, or one (duplicated) when fewer heads than ranks."""
    return max(heads // tp, 1)


def weight_bytes_per_rank(cfg: ModelConfig, s: PlanSettings) -> dict[str, int]:
    lin, experts = _formats(s.weights)
    tp, h, db = s.split, cfg.hidden_size, s.dtype_bytes
    kv_local = _local_heads(cfg.num_kv_heads, tp) * cfg.head_dim
    attn = (2 * h * cfg.q_size / tp + 2 * h * kv_local) * cfg.num_layers
    n_msa = len(cfg.sparse_layers)
    index = 0.0
    if cfg.msa is not None:
        m = cfg.msa
        index = n_msa * (_local_heads(m.index_heads, tp) + 1) * m.index_dim * h
    p = parameter_count(cfg)
    out = {
        "embeddings": p["embeddings"] / tp * db, "attention": _linear_bytes(attn, lin, db),
        "index": _linear_bytes(index, lin, db), "dense_mlp": _linear_bytes(p["dense_mlp"] / tp, lin, db),
        "routed_experts": _linear_bytes(p["routed_experts"] / s.tp, experts, db),  # E/EP experts, split tp/EP ways
        "shared_expert": _linear_bytes(p["shared_expert"] / tp, lin, db),
        "routers_norms": _router_norm_bytes(cfg, p, db), "lm_head": p["lm_head"] / tp * db,
        "eagle3_draft": _draft_bytes(s.draft, tp, db) if s.draft else 0,
    }
    return {k: int(round(v)) for k, v in out.items()}


def _router_norm_bytes(cfg: ModelConfig, p: dict[str, int], db: int) -> float:
    """Norms in the model dtype, routers and correction biases in fp32 (replicated on every rank)."""
    router = 0 if cfg.moe is None else len(cfg.moe_layers) * cfg.moe.num_experts * (cfg.hidden_size + 1)
    return (p["routers_norms"] - router) * db + router * 4


def _draft_bytes(d: DraftShape, tp: int, db: int) -> float:
    """One Eagle3 layer in the model dtype: fc [H, 3H] replicated, attention with 2H inputs, MLP, lm_head."""
    h, kv_local = d.hidden_size, _local_heads(d.num_kv_heads, tp) * d.head_dim
    attn = 2 * h * (d.num_heads * d.head_dim / tp + 2 * kv_local) + h * d.num_heads * d.head_dim / tp
    params = 3 * h * h + attn + 3 * h * d.intermediate_size / tp + d.vocab_size * h / tp + 6 * h
    return params * db


# --- KV cache ------------------------------------------------------------------------------------

def _kv_elem_bytes(fmt: KVFormat, plain_bytes: int) -> float:
    return {KVFormat.PLAIN: plain_bytes, KVFormat.FP8: 1, KVFormat.NVFP4: 0.5 + 1 / NV_BLOCK}[fmt]


def layer_kv_format(kv_cache_dtype: str, kind: AttnKind) -> KVFormat:
    """As runtime.kv_cache.layer_format: hybrid = MSA layers NVFP4, dense layers FP8."""
    if kv_cache_dtype == "hybrid":
        return KVFormat.NVFP4 if kind is AttnKind.MSA else KVFormat.FP8
    return {"fp8": KVFormat.FP8, "nvfp4": KVFormat.NVFP4}.get(kv_cache_dtype, KVFormat.PLAIN)


KV_DTYPES = ("auto", "bf16", "fp8", "nvfp4", "hybrid")


def kv_bytes_per_token(cfg: ModelConfig, s: PlanSettings) -> tuple[int, int]:
    """(K + V bytes, index-key bytes) one token costs on a rank over every layer (the draft layer too)."""
    if s.kv_cache_dtype not in KV_DTYPES:
        raise InputError(f"unknown kv_cache_dtype {s.kv_cache_dtype!r} (choose from {', '.join(KV_DTYPES)})")
    plain = s.dtype_bytes if s.kv_cache_dtype == "auto" else 2
    kv_local = _local_heads(cfg.num_kv_heads, s.split) * cfg.head_dim
    kv = index = 0.0
    for kind in cfg.attn_kinds:
        b = _kv_elem_bytes(layer_kv_format(s.kv_cache_dtype, kind), plain)
        kv += 2 * kv_local * b
        if kind is AttnKind.MSA:
            index += cfg.msa.index_dim * b
    if s.draft is not None:  # the draft layer: FP8 under hybrid, as a dense layer
        b = _kv_elem_bytes(layer_kv_format(s.kv_cache_dtype, AttnKind.DENSE), plain)
        kv += 2 * _local_heads(s.draft.num_kv_heads, s.split) * s.draft.head_dim * b
    return int(round(kv)), int(round(index))


# --- the plan ------------------------------------------------------------------------------------

def workspace_bytes(cfg: ModelConfig, s: PlanSettings) -> int:
    """Activation peak of one step of max_num_tokens tokens (fp32 upper bound) + sampled logits + context."""
    h, tp = cfg.hidden_size, s.split
    moe = 0 if cfg.moe is None else cfg.moe.top_k * 3 * cfg.moe.intermediate_size
    per_token = 8 * h + 2 * (cfg.q_size // tp) + 2 * cfg.dense_intermediate_size // tp + moe
    logits = 2 * s.max_num_seqs * cfg.vocab_size
    return int(4 * (s.max_num_tokens * per_token + logits) + s.context_reserve_gib * GIB)


def _check_settings(cfg: ModelConfig, s: PlanSettings) -> None:
    if s.tp < 1 or (s.ep is not None and s.ep < 1):
        raise InputError(f"tp and ep must be positive, got tp={s.tp}, ep={s.ep}")
    if s.ep is not None and s.ep not in (1, s.tp) and s.tp % s.ep:
        raise InputError(f"--ep {s.ep} must divide --tp {s.tp}")
    if cfg.moe is not None and cfg.moe.num_experts % (s.ep or s.tp):
        raise InputError(f"{cfg.moe.num_experts} experts do not split over EP {s.ep or s.tp}")
    for what, n in (("num_attention_heads", cfg.num_heads), ("vocab_size", cfg.vocab_size)):
        if n % s.split:
            raise InputError(f"{what} {n} does not split over TP {s.tp}")
    if s.page_tokens < 1 or s.max_num_seqs < 1 or s.max_num_tokens < 1:
        raise InputError("page_tokens, max_num_seqs and max_num_tokens must be positive")
    if not 0 < s.gpu_memory_gib < math.inf:
        raise InputError(f"gpu_memory_gib must be a positive finite number, got {s.gpu_memory_gib}")
    if not 0 < s.gpu_memory_utilization <= 1:
        raise InputError(f"gpu_memory_utilization must be in (0, 1], got {s.gpu_memory_utilization}")


def plan_memory(cfg: ModelConfig, s: PlanSettings) -> MemoryPlan:
    """Bytes per rank for cfg under settings s (see the module docstring)."""
    _check_settings(cfg, s)
    parts = weight_bytes_per_rank(cfg, s)
    kv, index = kv_bytes_per_token(cfg, s)
    page = (kv + index) * s.page_tokens
    budget = int(s.gpu_memory_gib * GIB * s.gpu_memory_utilization)
    work = workspace_bytes(cfg, s)
    graphs = int(s.cuda_graph_reserve_gib * GIB)
    room = budget - sum(parts.values()) - work - graphs
    max_len = s.max_model_len or cfg.max_position_embeddings
    return MemoryPlan(s, parts, work, graphs, kv, index, page, budget, max_len, max(room // page, 0))


def weight_format_for(cfg: ModelConfig, choice: str = "auto") -> WeightFormat:
    """The format named by `choice`, or for "auto" the checkpoint's own (quantization_config)."""
    if choice != "auto":
        try:
            return WeightFormat(choice)
        except ValueError:
            raise InputError(f"unknown weight format {choice!r} (choose from auto, "
                             f"{', '.join(w.value for w in WeightFormat)})") from None
    return native_format(cfg)


def native_format(cfg: ModelConfig) -> WeightFormat:
    """How the runtime holds a quantized checkpoint natively: MXFP8 as stored; the NVFP4 release's experts packed,
    or with their codes as e4m3 bytes where the process says so (runtime.nv_codes); else the model dtype."""
    if cfg.quant is QuantMethod.NVFP4:
        return WeightFormat.NVFP4_EXPERTS_E4M3 if nv_codes() is NvCodes.E4M3 else WeightFormat.NVFP4_EXPERTS
    return WeightFormat.MXFP8 if cfg.quant is QuantMethod.MXFP8 else WeightFormat.BF16


def preset_config(name: str) -> ModelConfig:
    """A published config shipped with m3bench (`minimax-m3`: the bf16 checkpoint's VL config.json)."""
    path = PRESETS_DIR / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.json"))
        raise InputError(f"unknown preset {name!r} (choose from {', '.join(known)})")
    return ModelConfig.from_pretrained(path)


def check_fits(cfg: ModelConfig, s: PlanSettings) -> MemoryPlan:
    """The plan, or InputError with its message when the model (and one sequence's KV) does not fit."""
    plan = plan_memory(cfg, s)
    if not plan.fits:
        raise InputError(plan.message())
    return plan
