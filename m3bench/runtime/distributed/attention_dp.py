"""Attention data parallelism (EngineConfig.attention_dp, `--attention-dp --tp N`): N engines, one per rank.

Each rank runs its own engine (scheduler, requests, KV cache, Eagle3 draft with its own draft KV) on a model
whose attention, dense layers, shared experts, embeddings and lm_head are whole (no all-reduce in
attention), while the routed experts stay expert-parallel: rank r owns E/N of them and every MoE layer
exchanges the ranks' tokens (layers/moe_exchange.py). Rank 0 is the front (distributed/dp_front.py): it
assigns each request to the least-loaded rank and merges the ranks' outputs; every step all ranks step
together, a rank without work joining the exchanges with no tokens.

    parts = build_attention_dp(resolve(cfg), Prebuilt())      # what LLM builds when cfg.attention_dp
    serve_rank(spec, groups)                                   # ranks > 0 (spawned, or under torchrun)

Processes, rendezvous, worker-death errors and the shutdown deadline are the tensor-parallel run's
(launcher.py, groups.py, driver.Driver).
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, replace
from typing import Any

import torch

from m3bench.runtime import engine_builder, model_builder
from m3bench.runtime.distributed.dp_front import DPFront, rank_tick
from m3bench.runtime.distributed.dp_messages import receive_plan
from m3bench.runtime.distributed.driver import Driver
from m3bench.runtime.distributed.groups import RankGroups, destroy_groups, init_groups, rank_device, torchrun_rank
from m3bench.runtime.distributed.launcher import spawn_ranks
from m3bench.runtime.distributed.protocol import Op, recv_header
from m3bench.runtime.distributed.worker import agree_min
from m3bench.runtime.engine_config import MAX_SEED, EngineConfig
from m3bench.runtime.errors import InputError
from m3bench.runtime.layers.moe_exchange import ExpertExchange, install_exchange
from m3bench.runtime.parallel import TPGroup


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to build its engine as rank 0 builds its own."""

    engine: EngineConfig  # resolved, attention_dp set
    config: Any = None  # a ModelConfig, or a directory holding config.json (default: engine.model)
    tokenizer: Any = None  # the caller's transformers tokenizer (default: the checkpoint's)

    @property
    def device(self) -> str:
        return self.engine.device


@dataclass(frozen=True)
class RankEngine:
    parts: Any  # engine_builder.EngineParts of this rank's own engine
    exchange: ExpertExchange


def build_attention_dp(cfg: EngineConfig, pre: Any) -> Any:
    """Rank 0's EngineParts: its own engine behind the DPFront (parts.engine), the ranks' Driver (parts.tp)."""
    if pre.model is not None or pre.draft is not None:
        raise InputError("attention_dp needs checkpoint directories for the model and the draft (each rank loads them)")
    spec = RankSpec(cfg, pre.model_config, pre.tokenizer)
    check_fits(spec)
    driver = start_ranks(spec)
    driver.in_step = True  # building: a failure stops the ranks the hard way (they wait in a collective)
    try:
        with driver.guard():
            mine = build_rank(spec, driver.groups)
        driver.in_step = False
    except BaseException:
        driver.shutdown()
        raise
    front = DPFront(driver, mine.parts.engine, mine.exchange, mine.parts.draft is not None)
    return replace(mine.parts, config=cfg, engine=front, tp=driver)


def check_fits(spec: RankSpec) -> None:
    """Refuse a rank count the routed experts do not split over, before any process starts."""
    from m3bench.runtime.model import M3ForCausalLM

    world = spec.engine.tensor_parallel_size
    cfg = model_builder.model_config_of(spec.engine, spec.config)
    try:
        M3ForCausalLM(cfg, model_builder.torch_dtype(spec.engine.dtype), "meta", ep=TPGroup(0, world))
    except ValueError as e:
        raise InputError(f"attention_dp over {world} ranks does not fit this model: {e}") from None


def start_ranks(spec: RankSpec) -> Driver:
    """Spawn ranks 1..N-1 (or join torchrun's) and return rank 0's Driver; ranks > 0 under torchrun serve here."""
    world = spec.engine.tensor_parallel_size
    launched = torchrun_rank(world)
    if launched is not None:
        rank, local_rank = launched
        groups = init_groups(rank, world, "env://", rank_device(spec.device, local_rank))
        if rank != 0:
            serve_rank(spec, groups)
            destroy_groups(groups)
            raise SystemExit(0)
        return _registered(Driver(groups, None))
    return _registered(Driver(*spawn_ranks(world, spec, serve_rank)))


def _registered(driver: Driver) -> Driver:
    atexit.register(driver.shutdown)
    return driver


def build_rank(spec: RankSpec, groups: RankGroups) -> RankEngine:
    """This rank's engine (every rank builds at once: a profiling prefill goes through the exchanges)."""
    local = replace(spec.engine, tensor_parallel_size=1, attention_dp=False)
    model = model_builder.build_model(local, groups.device, None, spec.config, ep=groups.tp)
    model_builder.install_backend(model, local.attention_backend, local.tokens_per_block)
    exchange = install_exchange(model, groups.tp, groups.control)
    parts = engine_builder.build(local, engine_builder.Prebuilt(model=model, model_config=spec.config,
                                                                tokenizer=spec.tokenizer))
    exchange.finish_tick()
    if groups.tp.rank:  # unseeded sampling: each rank its own stream (rank 0 the engine seed, as one engine)
        parts.engine.sampler.generator.manual_seed(rank_seed(spec.engine.seed, groups.tp.rank))
    max_len = agree_min(groups.control, parts.max_model_len)  # one context limit: a request's output cannot
    parts.engine.max_model_len = max_len  # depend on the rank it ran on
    return RankEngine(replace(parts, max_model_len=max_len), exchange)


def rank_seed(seed: int, rank: int) -> int:
    """The sampler seed of rank r > 0 (within torch's 64 bits)."""
    return (seed + rank * 1_000_003) % (MAX_SEED + 1)


@torch.inference_mode()
def serve_rank(spec: RankSpec, groups: RankGroups) -> None:
    """Ranks > 0: build this rank's engine, then run one step per STEP header until STOP."""
    mine = build_rank(spec, groups)
    seqs: dict[int, Any] = {}
    while True:
        op, fields = recv_header(groups.control)
        if op is Op.STOP:
            mine.exchange.close()
            return
        if op is not Op.STEP:
            raise RuntimeError(f"attention-DP rank got {op!r} (protocol bug)")
        plan = receive_plan(groups.control, fields)
        rank_tick(mine.parts.engine, mine.exchange, groups, plan, seqs)
