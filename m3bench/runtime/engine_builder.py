"""Building an engine from an EngineConfig: ranks, model, backend, speculation, KV pool, step loop.

    parts = build(resolve(cfg))                  # EngineParts: model, tokenizer, spec, engine, max_model_len, tp
    parts = build(cfg, Prebuilt(model=m, draft=d))   # pieces the caller built (tests, research code)

The order is the contract: the tensor-parallel ranks start first (they build their own shards from the
same EngineConfig, distributed/worker.py), then rank 0's model and attention backend, the Eagle3
draft, the pool (sized from free memory on CUDA after a profiling prefill that every rank runs), and
the step loop. `runtime.LLM` is the API over the parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from m3bench.runtime.block_manager import BlockManager, blocks_for_budget
from m3bench.runtime.engine import DecodeGraphs, Engine, ModelRunner
from m3bench.runtime.engine_config import EngineConfig
from m3bench.runtime.errors import InputError
from m3bench.runtime.kv_cache import KVCache
from m3bench.runtime.model_builder import (
    build_model,
    build_speculation,
    check_graphs,
    eos_ids,
    install_backend,
    kv_dtype,
    load_tokenizer,
    profile_forward,
)
from m3bench.runtime.sampler import Sampler
from m3bench.runtime.scheduler import Scheduler
from m3bench.runtime.step_timing import StepClock

CPU_DEFAULT_POOL_TOKENS = 16384  # pool size on CPU when num_kv_blocks is not given


@dataclass(frozen=True)
class Prebuilt:
    """Pieces a caller hands over already built; the rest is built from the EngineConfig."""

    model: Any = None  # an M3ForCausalLM (its device and dtype win)
    model_config: Any = None  # a ModelConfig, or a directory holding config.json (default: the model directory)
    tokenizer: Any = None  # a transformers tokenizer (default: the checkpoint's)
    draft: Any = None  # an Eagle3 draft object (default: loaded from EngineConfig.draft)


@dataclass(frozen=True)
class EngineParts:
    config: EngineConfig  # resolved
    model: Any
    tok: Any  # m3bench.runtime.tokenizer.Tokenizer of the checkpoint, or None
    tokenizer: Any  # the transformers tokenizer (the caller's, or tok's), or None
    spec: Any  # SpecConfig, or None
    draft: Any  # Eagle3Draft, or None
    engine: Any  # the step loop: an Engine (with its SpecRunner under speculation; overlapped or not)
    max_model_len: int
    tp: Any  # the tensor-parallel Driver of rank 0, or None at TP 1
    clock: StepClock  # times each engine step and the forwards in it (runtime/step_timing.py)


def build(cfg: EngineConfig, pre: Prebuilt = Prebuilt()) -> EngineParts:
    """Every part of the engine `cfg` describes (resolved); tensor-parallel workers stop if building fails."""
    if not cfg.is_resolved:
        raise ValueError("build() takes a resolved EngineConfig (engine_config.resolve)")
    tp = start_tp(cfg, pre)
    try:
        return _assemble(cfg, pre, tp)
    except BaseException:
        if tp is not None:
            tp.shutdown()
        raise


def _assemble(cfg: EngineConfig, pre: Prebuilt, tp: Any) -> EngineParts:
    device = tp.device if tp is not None else torch.device(cfg.device)
    model = pre.model if pre.model is not None else build_model(cfg, device, tp.tp if tp else None, pre.model_config)
    install_backend(model, cfg.attention_backend, cfg.tokens_per_block, prebuilt=model is pre.model)
    check_graphs(cfg, model)
    tok = load_tokenizer(cfg.model) if pre.tokenizer is None else None
    tokenizer = pre.tokenizer if pre.tokenizer is not None else getattr(tok, "hf", None)
    spec, draft = build_speculation(model, cfg, pre.draft)
    kv, bm = build_pool(cfg, model, spec, draft, tp)
    max_model_len = context_length(cfg.max_model_len, model.cfg.max_position_embeddings, bm.num_blocks,
                                   cfg.tokens_per_block, _lookahead(spec))
    engine = build_engine(cfg, model, kv, bm, spec, draft, tokenizer, eos_ids(model.cfg, tok), max_model_len, tp)
    clock = StepClock(cuda=model.device.type == "cuda")
    (engine.runner if spec is None else engine.spec).clock = clock  # the runner times its forwards
    return EngineParts(cfg, model, tok, tokenizer, spec, draft, engine, max_model_len, tp, clock)


def start_tp(cfg: EngineConfig, pre: Prebuilt) -> Any:
    """The tensor-parallel Driver of rank 0 (None at TP 1); see m3bench.runtime.distributed."""
    if cfg.tensor_parallel_size == 1:  # (under torchrun too: each process then runs its own TP-1 engine)
        return None
    if pre.model is not None:
        raise InputError("tensor_parallel_size > 1 needs a checkpoint directory (each rank loads its own shards)")
    if pre.draft is not None:
        raise InputError("tensor_parallel_size > 1 needs the draft as a checkpoint directory (each rank loads it)")
    from m3bench.runtime.distributed.driver import start_driver
    from m3bench.runtime.distributed.worker import WorkerSpec

    return start_driver(cfg.tensor_parallel_size, WorkerSpec(cfg, pre.model_config))


def build_pool(cfg: EngineConfig, model: Any, spec: Any, draft: Any, tp: Any) -> tuple[KVCache, BlockManager]:
    """The paged KV cache (every rank allocates the same) and its BlockManager; with CUDA graphs one scratch
    page more, owned by no request, for the padding rows."""
    P, kvd, n = cfg.tokens_per_block, kv_dtype(cfg), pool_pages(cfg, model, draft, tp)
    extra = 1 if cfg.cuda_graphs else 0
    if tp is not None:
        tp.alloc(n + extra, P, kvd)  # the other ranks' pools have this one's pages
    kv = KVCache(model.cfg, n + extra, P, kvd, model.dtype, model.device, model.tp)
    caching = cfg.enable_prefix_caching and (spec is None or _spec_caching(spec))
    return kv, BlockManager(n, P, cfg.max_batch_size, max_pages(cfg, model, n), model.device, caching)


def max_pages(cfg: EngineConfig, model: Any, num_blocks: int) -> int:
    """Pages one sequence may hold: its longest position's, within the pool."""
    return min(-(-model.cfg.max_position_embeddings // cfg.tokens_per_block), num_blocks)


def context_length(asked: int | None, max_pos: int, num_blocks: int, P: int, lookahead: int = 0) -> int:
    """max_model_len: `asked`, or the most that positions and the pool allow; speculation keeps `lookahead`
    positions past it. InputError when `asked` exceeds max_position_embeddings or the KV pool."""
    most = min(max_pos, num_blocks * P) - lookahead
    if asked is None:
        return most
    if asked < 2:
        raise InputError(f"max_model_len must be >= 2, got {asked}")
    if asked + lookahead > max_pos:
        raise InputError(f"max_model_len {asked} exceeds the model's max_position_embeddings {max_pos}"
                         + (f" (less {lookahead} speculative lookahead positions)" if lookahead else ""))
    if asked + lookahead > num_blocks * P:
        raise InputError(f"max_model_len {asked} needs {-(-(asked + lookahead) // P)} KV pages of {P} tokens; "
                         f"the pool has {num_blocks}: raise num_kv_blocks (or gpu_memory_utilization)")
    return asked


def pool_pages(cfg: EngineConfig, model: Any, draft: Any, tp: Any) -> int:
    """KV pages: as asked, 16384 tokens' worth on CPU, or what free CUDA memory holds after a profiling prefill
    (every rank profiles and sizes its pool; the smallest wins)."""
    if cfg.num_kv_blocks is not None:
        return cfg.num_kv_blocks
    P, kvd = cfg.tokens_per_block, kv_dtype(cfg)
    if model.device.type != "cuda":
        return -(-CPU_DEFAULT_POOL_TOKENS // P)
    page_b = KVCache.page_bytes(model.cfg, P, kvd, model.dtype, model.tp) + draft_page_bytes(draft, P, kvd, model)
    tokens = min(cfg.max_num_tokens, model.cfg.max_position_embeddings)
    if tp is not None:
        tp.start_profile(tokens, P, kvd, page_b, cfg.gpu_memory_utilization)
    profile_forward(model, tokens, P, kvd)
    n = blocks_for_budget(page_b, model.device, cfg.gpu_memory_utilization)
    n = n if tp is None else tp.agree_min(n)
    return max(n - 1, 1)  # room for the scratch page of CUDA graphs


def draft_page_bytes(draft: Any, P: int, kvd: Any, model: Any) -> int:
    if draft is None:
        return 0
    from m3bench.runtime.speculative.setup import draft_bytes_per_target_page

    return draft_bytes_per_target_page(draft.cfg, P, kvd, model.dtype)


def build_engine(cfg: EngineConfig, model: Any, kv: KVCache, bm: BlockManager, spec: Any, draft: Any,
                 tokenizer: Any, eos: tuple[int, ...], max_model_len: int, tp: Any) -> Any:
    """The step loop: plain or speculative (spec set), overlapped or not (cfg.async_scheduling)."""
    scheduler = Scheduler(bm, cfg.max_batch_size, cfg.max_num_tokens)
    sampler = Sampler(model.device, cfg.seed)
    if spec is not None:
        return _spec_engine(cfg, model, kv, bm, scheduler, sampler, spec, draft, tokenizer, eos, max_model_len, tp)
    graphs = DecodeGraphs(model, kv, bm, bm.num_blocks, cfg.max_batch_size) if cfg.cuda_graphs else None
    if graphs is not None:
        graphs.capture()
    runner = ModelRunner(model, kv, bm, model.device, graphs)
    if tp is not None:  # each step's inputs go to the other ranks, which run the same forward
        runner.link = tp
    return Engine(runner, scheduler, sampler, tokenizer, eos, max_model_len, overlap=bool(cfg.async_scheduling))


def _spec_engine(cfg, model, kv, bm, scheduler, sampler, spec, draft, tokenizer, eos, max_model_len, tp) -> Any:
    from m3bench.runtime.speculative.setup import build_spec_engine

    engine = build_spec_engine(model, kv, bm, scheduler, sampler, tokenizer, eos, max_model_len, spec, draft,
                               cfg.max_batch_size, cfg.max_num_tokens, cfg.cuda_graphs,  # captures its own graphs
                               overlap=bool(cfg.async_scheduling))
    if tp is not None:  # the other ranks get a draft pool like rank 0's; each step's inputs go to them
        store = engine.spec.layout.store
        tp.alloc_draft(store.num_pages, store.page_size, kv.kv_dtype)
        engine.spec.link = tp
    return engine


def _spec_caching(spec: Any) -> bool:
    from m3bench.runtime.speculative.setup import caching_allowed

    return caching_allowed(spec)


def _lookahead(spec: Any) -> int:
    """Positions the scheduler reserves per generating request under speculation (0 without)."""
    if spec is None:
        return 0
    from m3bench.runtime.speculative.setup import lookahead_tokens

    return lookahead_tokens(spec)
