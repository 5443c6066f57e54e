"""The draft under tensor parallelism on CPU: two gloo ranks give the logits of one rank (float64)."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.parallel import SINGLE, TPGroup
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.speculative.draft import Eagle3Draft
from m3bench.runtime.speculative.tiny_draft import random_draft_tensors
from spec_helpers import eagle_cfg

F64 = torch.float64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _logits(tp: TPGroup, own_head: bool) -> torch.Tensor:
    cfg = eagle_cfg()
    w = random_draft_tensors(cfg, 0, F64)
    g = torch.Generator().manual_seed(1)
    embed, head = torch.randn(40, 32, generator=g, dtype=F64), torch.randn(40, 32, generator=g, dtype=F64)
    captured = torch.randn(9, 3, cfg.target_hidden_size, generator=g, dtype=F64)
    ids = torch.randint(0, 40, (9,), generator=g)
    if not own_head:
        w.pop("lm_head.weight")
    d = Eagle3Draft(cfg, F64, "cpu", tp)
    d.load_weights(w)
    n = 40 // tp.world
    d.bind_target(embed[tp.rank * n:(tp.rank + 1) * n], head[tp.rank * n:(tp.rank + 1) * n])  # vocab-parallel rows
    meta = build_attn_metadata([6, 3], [6, 3], [[0], [1]], 8)
    kv = DraftKV(2, 8, cfg.num_kv_heads // tp.world, cfg.head_dim, KVDtype.AUTO, F64)
    return d.compute_logits(d(ids, meta.positions, d.combine_features(captured), meta, kv).hidden)


def _worker(rank: int, world: int, port: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        tp = TPGroup.from_torch_distributed()
        both = torch.stack((_logits(tp, True), _logits(tp, False)))
        if rank == 0:
            torch.save(both, out_path)
    finally:
        dist.destroy_process_group()


def test_two_ranks_match_one(tmp_path):
    out = str(tmp_path / "logits.pt")
    mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, join=True, start_method="spawn")
    got = torch.load(out)
    for i, own in enumerate((True, False)):
        assert torch.allclose(got[i], _logits(SINGLE, own), atol=1e-10, rtol=0)
