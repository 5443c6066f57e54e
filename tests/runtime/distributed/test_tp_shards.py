"""Sharding at TP 2 (two gloo ranks, float64): each rank reads exactly its shards from the checkpoint
(heads, intermediate and vocabulary halves, its own two experts whole), with one KV head the head
(and its index head) is duplicated on both ranks and the logits still equal one rank's, and dummy
weights are consistent across ranks."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tp_helpers import (
    ONE_KV_HEAD,
    TP_SPEC,
    free_port,
    init_gloo,
    random_prompts,
    tiny_checkpoint,
)

from m3bench.runtime.checkpoint import DTYPES, CheckpointReader, expected_tensors
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.contiguous import prefill_logits
from m3bench.runtime.model import M3ForCausalLM, dummy_tensor
from m3bench.runtime.parallel import TPGroup

WORLD = 2
HALVED = re.compile(r"(embed_tokens|lm_head|attn\.(q|o|index_q)_proj|(mlp|moe\.shared)\.(gate|up|down)_proj)\.weight$")
HEADS = re.compile(r"attn\.[kv]_proj\.weight$")
EXPERT = re.compile(r"moe\.experts\.(\d+)\.")


def _load(ckpt: str, tp: TPGroup) -> tuple[M3ForCausalLM, int]:
    cfg = ModelConfig.from_pretrained(ckpt)
    model = M3ForCausalLM(cfg, torch.float64, "cpu", tp)
    reader = CheckpointReader(ckpt, cfg)
    model.load_weights(reader)
    return model, reader.bytes_read


def _dummy(ckpt: str, tp: TPGroup) -> M3ForCausalLM:
    model = M3ForCausalLM(ModelConfig.from_pretrained(ckpt), torch.float64, "cpu", tp)
    model.init_dummy(seed=4)
    return model


def _worker(rank: int, port: int, ckpts: list[str], ids: list[int], out: str) -> None:
    init_gloo(rank, WORLD, port)
    try:
        tp = TPGroup.from_torch_distributed()
        result = {}
        for ckpt in ckpts:
            model, nbytes = _load(ckpt, tp)
            result[ckpt] = (nbytes, prefill_logits(model, ids, [50, 30]))
        result["dummy"] = prefill_logits(_dummy(ckpts[0], tp), ids)
        torch.save(result, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def expected_bytes(ckpt: str, rank: int) -> int:
    """Bytes rank `rank` of 2 must read, from the schema alone: halves, duplicated KV heads, own experts."""
    cfg = ModelConfig.from_pretrained(ckpt)
    reader = CheckpointReader(ckpt, cfg)
    total = 0
    for name, shape in expected_tensors(cfg).items():
        n = torch.Size(shape).numel() * DTYPES[reader.sources[name].data.dtype].itemsize
        expert = EXPERT.search(name)
        if expert:
            per_rank = cfg.moe.num_experts // WORLD
            n = n if int(expert.group(1)) // per_rank == rank else 0
        elif HALVED.search(name) and not (name.endswith("index_q_proj.weight") and cfg.msa.index_heads == 1):
            n //= WORLD
        elif HEADS.search(name):
            n = n if cfg.num_kv_heads == 1 else n // WORLD  # one KV head: both ranks read all of it
        total += n
    return total


def test_each_rank_reads_its_shards_and_one_kv_head_is_duplicated(tmp_path):
    ckpts = [str(tiny_checkpoint(tmp_path / "two_kv")), str(tiny_checkpoint(tmp_path / "one_kv", ONE_KV_HEAD))]
    ids = random_prompts([80])[0]  # 80 tokens > 2 MSA blocks of 16: selection active
    out = str(tmp_path / "result")
    mp.start_processes(_worker, args=(free_port(), ckpts, ids, out), nprocs=WORLD, join=True, start_method="spawn")
    ranks = [torch.load(f"{out}.{r}") for r in range(WORLD)]
    for ckpt in ckpts:
        one, full_bytes = _load(ckpt, TPGroup())
        for r in range(WORLD):
            nbytes, logits = ranks[r][ckpt]
            assert nbytes == expected_bytes(ckpt, r) < full_bytes
            assert torch.allclose(logits, prefill_logits(one, ids, [50, 30]), atol=1e-10, rtol=0)
    # dummy weights: each rank draws every full tensor from its own per-name seed and keeps its shard,
    # so TP 2 is the TP-1 model whose canonical tensors are those draws
    one = M3ForCausalLM(ModelConfig.from_pretrained(ckpts[0]), torch.float64)
    one.load_canonical({s.name: dummy_tensor(s.name, tuple(s.target.shape), s.target.dtype, one.cfg, 4)
                        for s in one.weight_slots()})
    assert torch.allclose(ranks[0]["dummy"], prefill_logits(one, ids), atol=1e-10, rtol=0)


def test_expected_bytes_of_the_two_ranks_cover_the_checkpoint_once(tmp_path):
    """The expectation itself: ranks split the checkpoint, sharing only replicated tensors (small)."""
    ckpt = str(tiny_checkpoint(tmp_path))
    _, full = _load(ckpt, TPGroup())
    assert full < expected_bytes(ckpt, 0) + expected_bytes(ckpt, 1) < 1.05 * full
    assert TP_SPEC.num_kv_heads == 2 and ONE_KV_HEAD.num_kv_heads == 1
