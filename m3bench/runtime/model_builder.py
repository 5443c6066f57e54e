"""Building one rank's model from an EngineConfig: weights, attention backend, Eagle3 draft, tokenizer.

    model = build_model(cfg, torch.device("cpu"))            # this rank's shards with tp=TPGroup(...)
    install_backend(model, cfg.attention_backend, cfg.tokens_per_block)
    spec, draft = build_speculation(model, cfg)               # (None, None) without a draft

Every rank builds its model with these functions (rank 0 in engine_builder.py, the others in
distributed/worker.py), so the ranks' shards and dummy weights agree. Nothing here knows about
tensor-parallel processes or the engine loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.engine_config import AttentionBackend, DType, EngineConfig, LoadFormat
from m3bench.runtime.errors import InputError
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers.weight_format import LinearFormat

TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16,
                DType.FLOAT64: torch.float64}


def torch_dtype(dtype: DType) -> torch.dtype:
    """The compute dtype of a resolved config (AUTO is resolve()'s to decide, never here)."""
    if dtype is DType.AUTO:
        raise ValueError("dtype AUTO must be resolved first (engine_config.resolve)")
    return TORCH_DTYPES[dtype]


def kv_dtype(cfg: EngineConfig) -> KVDtype:
    return KVDtype(cfg.kv_cache_dtype.value)


def build_model(cfg: EngineConfig, device: torch.device, tp: Any = None, model_config: Any = None, ep: Any = None):
    """This rank's M3ForCausalLM (`tp`: its shards only): the checkpoint's weights, or dummy ones seeded by cfg.seed.
    `model_config`: a ModelConfig or a directory holding config.json (default: cfg.model); `ep`: the ranks the
    routed experts split over when not tp's (attention DP)."""
    from m3bench.runtime.model import M3ForCausalLM

    mcfg = model_config_of(cfg, model_config)
    m = M3ForCausalLM(mcfg, dtype=torch_dtype(cfg.dtype), device=device, tp=tp,
                      weights=linear_format_for(mcfg, cfg.weights_dtype), ep=ep)
    if cfg.load_format is LoadFormat.DUMMY:
        m.init_dummy(cfg.seed)
    else:
        from m3bench.runtime.checkpoint import CheckpointReader

        reader = CheckpointReader(model_dir(cfg), m.cfg)
        reader.validate()
        m.load_weights(reader)
    return m


def linear_format_for(cfg: ModelConfig, weights_dtype: Any) -> LinearFormat:
    """The linear layers' format: MXFP8 / NVFP4 experts where the runtime keeps the checkpoint's weights natively."""
    from m3bench.runtime.fit_check import resident_format
    from m3bench.runtime.memory_plan import WeightFormat

    return {WeightFormat.MXFP8: LinearFormat.MXFP8, WeightFormat.NVFP4_EXPERTS: LinearFormat.NVFP4_EXPERTS,
            WeightFormat.NVFP4_EXPERTS_E4M3: LinearFormat.NVFP4_EXPERTS,  # codes expanded once loaded (mx_loading)
            }.get(resident_format(cfg, weights_dtype), LinearFormat.PLAIN)


def model_config_of(cfg: EngineConfig, model_config: Any = None) -> ModelConfig:
    if isinstance(model_config, ModelConfig):
        return model_config
    return ModelConfig.from_pretrained(Path(model_config) if model_config is not None else model_dir(cfg))


def model_dir(cfg: EngineConfig) -> Path:
    if cfg.model is None:
        raise InputError("no model directory given (pass a path, or config=... with load_format='dummy')")
    if not cfg.model.is_dir():
        raise InputError(f"model directory {cfg.model} does not exist")
    return cfg.model


def install_backend(model: Any, choice: AttentionBackend, tokens_per_block: int, prebuilt: bool = False) -> None:
    """Install the chosen attention backend (AUTO: Triton on CUDA, torch on CPU; a model the caller built
    keeps its own under AUTO) and check that it can serve the model at this page size."""
    from m3bench.runtime.attention import select

    picked = select.attention_choice(choice.value)
    if not (prebuilt and picked is select.AttentionChoice.AUTO):
        model.backend = select.make_backend(picked, model.device, model.cfg)
    select.check_backend_layout(model.backend, model.cfg, tokens_per_block)


def check_graphs(cfg: EngineConfig, model: Any) -> None:
    if cfg.cuda_graphs and not getattr(model.backend, "graph_safe", False):
        raise InputError("cuda_graphs needs a graph-safe attention backend; the torch backend reads host lengths")


def draft_dummy_seed(cfg: EngineConfig) -> int | None:
    """load_format dummy covers the draft too: only its config.json is read (seed + 1: not the target's)."""
    return cfg.seed + 1 if cfg.load_format is LoadFormat.DUMMY else None


def build_speculation(model: Any, cfg: EngineConfig, draft_source: Any = None) -> tuple[Any, Any]:
    """(SpecConfig, Eagle3Draft) of cfg.draft (or of `draft_source`, a draft the caller built), or (None, None)."""
    source = draft_source if draft_source is not None else cfg.draft
    if source is None:
        return None, None
    from m3bench.runtime.speculative.config import DraftKVLayout, SpecConfig
    from m3bench.runtime.speculative.setup import load_draft

    where = source if isinstance(source, (str, Path)) else "."
    spec = SpecConfig(Path(where), cfg.draft_len, DraftKVLayout(cfg.draft_kv.value), cfg.draft_page_size,
                      synthetic_acceptance_length=cfg.synthetic_acceptance)
    return spec, load_draft(source, model, draft_dummy_seed(cfg))


@torch.inference_mode()
def profile_forward(model: Any, tokens: int, P: int, kv: KVDtype) -> None:
    """One prefill of `tokens` on a throw-away cache, so the activation peak is known (every rank runs it)."""
    pages = -(-tokens // P)
    cache = KVCache(model.cfg, pages, P, kv, model.dtype, model.device, model.tp)
    meta = build_attn_metadata([tokens], [tokens], [list(range(pages))], P, model.device)
    torch.cuda.reset_peak_memory_stats(model.device)
    hidden = model(torch.zeros(tokens, dtype=torch.int64, device=model.device), meta.positions, meta, cache)
    model.compute_logits(hidden[-1:])
    del cache, hidden
    torch.cuda.empty_cache()


def load_tokenizer(model: Any) -> Any:
    """The checkpoint's tokenizer (m3bench.runtime.tokenizer.Tokenizer), or None when the directory has none."""
    if not isinstance(model, (str, Path)) or not any(
            (Path(model) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from m3bench.runtime.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(model)


def eos_ids(cfg: ModelConfig, tok: Any) -> tuple[int, ...]:
    """EOS ids of config.json plus, with a checkpoint tokenizer, generation_config.json and turn-close tokens."""
    return tuple(dict.fromkeys([*cfg.eos_token_ids, *getattr(tok, "eos_token_ids", ())]))
