"""Wiring speculation into the engine: the draft, its KV layout, the scheduler's look-ahead, the engine with
its SpecRunner strategy.

    spec = SpecConfig(draft_dir=Path("eagle3"), draft_len=3, draft_kv=DraftKVLayout.SHARED)
    draft = load_draft(spec.draft_dir, model)                     # or an Eagle3Draft already built
    engine = build_spec_engine(model, kv, bm, scheduler, sampler, tokenizer, eos, max_model_len, spec, draft,
                               max_batch_size, max_num_tokens)

Look-ahead: a generating request holds pages for 2K positions past its tokens (the verify chunk writes
L..L+K, the draft chain up to L'+K-2 <= L+2K-1), so the engine's max_model_len is 2K below the pool's.
Prefix caching: with SHARED the draft layer's pages are cached with the target's (a cached page's draft
KV is reused; only the draft entry at the last cached position was computed with the original
request's next token, which can change acceptance, never outputs); with SEPARATE the draft pool has no
cached pages and recomputing them would need the target's features there, i.e. the target's prefill:
prefix caching is off for that layout (`caching_allowed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from m3bench.runtime.errors import ConfigError
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.speculative.config import DraftKVLayout, EagleConfig, SpecConfig
from m3bench.runtime.speculative.draft import Eagle3Draft
from m3bench.runtime.speculative.draft_kv import SeparateDraftKV, SharedDraftKV


def lookahead_tokens(spec: SpecConfig) -> int:
    return 2 * spec.draft_len


def caching_allowed(spec: SpecConfig) -> bool:
    return spec.draft_kv is DraftKVLayout.SHARED


def load_draft(source: Any, model: Any, dummy_seed: int | None = None) -> Eagle3Draft:
    """An Eagle3Draft for `model` from a checkpoint dir (or the instance itself), bound to its embeddings.

    `dummy_seed` set (load_format="dummy"): only DIR/config.json is read; the weights are random."""
    if isinstance(source, Eagle3Draft):
        draft = source
    else:
        path = Path(source)
        if not path.is_dir():
            raise ConfigError(f"draft directory {path} does not exist")
        cfg = EagleConfig.from_pretrained(path)
        cfg.check_target(model.cfg)
        draft = Eagle3Draft(cfg, model.dtype, model.device, model.tp, model.backend)
        draft.load_weights(path if dummy_seed is None else dummy_draft_tensors(cfg, dummy_seed))
    draft.bind_target(model.embed_tokens, model.lm_head_weight())
    return draft


def dummy_draft_tensors(cfg: EagleConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random full-size tensors for `cfg` (every rank draws the same, then keeps its shard); a draft with
    its own vocabulary gets a random lm_head and d2t map, one sharing the target's uses the target's head."""
    from m3bench.runtime.speculative.tiny_draft import random_draft_tensors

    return random_draft_tensors(cfg, seed, torch.float32, with_lm_head=cfg.has_vocab_map)


def draft_store(draft: Eagle3Draft, num_pages: int, page_size: int, kv_dtype: KVDtype, dtype: torch.dtype,
                device: Any) -> DraftKV:
    c = draft.cfg
    heads = c.num_kv_heads // draft.tp.world if c.num_kv_heads % draft.tp.world == 0 else c.num_kv_heads
    return DraftKV(num_pages, page_size, heads, c.head_dim, kv_dtype, dtype, device)


def draft_bytes_per_target_page(draft_cfg: EagleConfig, tokens_per_block: int, kv_dtype: KVDtype,
                                dtype: torch.dtype) -> int:
    """The draft layer's share of one target page (same in both layouts: the same tokens are stored)."""
    return DraftKV(1, tokens_per_block, draft_cfg.num_kv_heads, draft_cfg.head_dim, kv_dtype, dtype, "meta").nbytes


def make_layout(spec: SpecConfig, draft: Eagle3Draft, kv: Any, bm: Any, max_batch_size: int, graphs: bool = False):
    """The draft-KV layout: pages the target's (SHARED), or a pool of the same token capacity (SEPARATE);
    with `graphs`, the pool's last page is a scratch page for padding rows (SHARED: the target's)."""
    page = spec.resolved_page_size(bm.P)
    if spec.draft_kv is DraftKVLayout.SHARED:
        return SharedDraftKV(draft_store(draft, kv.num_pages, page, kv.kv_dtype, kv.dtype, bm.table.device), bm)
    pages = -(-bm.num_blocks * bm.P // page) + max_batch_size + int(graphs)  # + per-request rounding
    return SeparateDraftKV(draft_store(draft, pages, page, kv.kv_dtype, kv.dtype, bm.table.device), bm.table.device,
                           reserved=int(graphs))


def spec_capture(model: Any, spec: SpecConfig, draft: Eagle3Draft, max_batch_size: int, max_num_tokens: int):
    """The buffer the target's residuals at the draft's capture layers land in, for the largest step (its
    tokens and every request's verify row); every tensor-parallel rank holds one (the residual stream is
    the same on all of them)."""
    from m3bench.runtime.model import CaptureSpec

    layers = spec.resolved_capture_layers(model.cfg.num_layers, draft.cfg)
    capacity = max_num_tokens + max_batch_size * (spec.draft_len + 1)
    buf = torch.zeros(capacity, len(layers), model.cfg.hidden_size, dtype=model.dtype, device=model.device)
    return CaptureSpec(tuple(layers), buf)


def build_spec_engine(model, kv, bm, scheduler, sampler, tokenizer, eos_ids, max_model_len: int, spec: SpecConfig,
                      draft: Eagle3Draft, max_batch_size: int, max_num_tokens: int, graphs: bool = False,
                      overlap: bool = False):
    """`graphs`: capture the verify and chain steps (speculative/graphs.py); the target's scratch page is
    page bm.num_blocks of kv (the caller allocated it). `overlap`: the drafts stay on the device (no
    sync after the chain; the next step is built while it runs)."""
    from m3bench.runtime.engine import Engine, ModelRunner
    from m3bench.runtime.speculative.runner import SpecRunner

    layout = make_layout(spec, draft, kv, bm, max_batch_size, graphs)
    scheduler.lookahead_tokens, scheduler.draft_tokens = lookahead_tokens(spec), spec.draft_len
    capture = spec_capture(model, spec, draft, max_batch_size, max_num_tokens)
    runner = SpecRunner(model, kv, bm, draft, layout, spec, capture, sampler.generator)
    bm.on_free.append(runner.release)
    if graphs:
        runner.graphs = capture_spec_graphs(runner, bm.num_blocks, max_batch_size)
    return Engine(ModelRunner(model, kv, bm, model.device), scheduler, sampler, tokenizer, eos_ids, max_model_len,
                  spec=runner, overlap=overlap)


def capture_spec_graphs(runner: Any, scratch_page: int, max_batch_size: int):
    """SpecGraphs of the runner, captured; the draft's attention backend must be graph safe too."""
    from m3bench.runtime.speculative.graphs import SpecGraphs

    on_cuda = runner.device.type == "cuda"  # (on a CPU nothing is captured: graphs.py runs the functions)
    if on_cuda and not getattr(runner.draft.layer.self_attn.backend, "graph_safe", False):
        raise ConfigError("cuda_graphs needs the draft on a graph-safe attention backend (the target's Triton "
                          "backend: build the Eagle3Draft with backend=model.backend)")
    graphs = SpecGraphs(runner, scratch_page, runner.layout.store.num_pages - 1, max_batch_size)
    graphs.capture()
    return graphs
