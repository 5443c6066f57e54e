"""Tensor parallelism on CPU: two gloo ranks give the logits of one rank (float64)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.contiguous import prefill_logits
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.parallel import TPGroup
from tiny_m3 import random_weights, tiny_m3_cfg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(cfg, tp, ckpt_dir):
    model = M3ForCausalLM(cfg, torch.float64, "cpu", tp)
    if ckpt_dir is None:
        model.load_canonical(random_weights(cfg, seed=0))
    else:
        from m3bench.runtime.checkpoint import CheckpointReader

        model.load_weights(CheckpointReader(ckpt_dir, cfg))
    return model


def _worker(rank: int, world: int, port: int, tied: bool, ids: list[int], out_path: str, ckpt_dir) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = tiny_m3_cfg(tie_word_embeddings=tied) if ckpt_dir is None else ModelConfig.from_pretrained(ckpt_dir)
        model = _load(cfg, TPGroup.from_torch_distributed(), ckpt_dir)
        logits = prefill_logits(model, ids, [50, 30])
        if rank == 0:
            torch.save(logits, out_path)
    finally:
        dist.destroy_process_group()


def test_parallel_group_world_one_is_identity():
    tp = TPGroup()
    x = torch.randn(3, 4)
    assert tp.all_reduce(x) is x and tp.all_gather(x) is x and tp.shard_size(8) == 8
    with pytest.raises(ValueError, match="does not split"):
        TPGroup(0, 3).shard_size(8)


def test_two_ranks_match_one_with_tied_embeddings(tmp_path):
    """Canonical weights sliced by the model itself; the tied lm_head is the embedding's vocab shard."""
    ids = torch.randint(0, 512, (80,), generator=torch.Generator().manual_seed(0)).tolist()
    want = _two_ranks_vs_one(tmp_path, True, ids, None)
    assert torch.allclose(torch.load(tmp_path / "logits.pt"), want, atol=1e-10, rtol=0)


def _two_ranks_vs_one(tmp_path, tied, ids, ckpt_dir):
    out = str(tmp_path / "logits.pt")
    mp.start_processes(_worker, args=(2, _free_port(), tied, ids, out, ckpt_dir), nprocs=2, join=True,
                       start_method="spawn")
    cfg = tiny_m3_cfg(tie_word_embeddings=tied) if ckpt_dir is None else ModelConfig.from_pretrained(ckpt_dir)
    return prefill_logits(_load(cfg, TPGroup(), ckpt_dir), ids, [50, 30])


def test_two_ranks_load_their_shards_through_the_reader(tmp_path):
    """Every sharded tensor goes through CheckpointReader.get(..., shard=Shard(dim, rank, 2))."""
    pytest.importorskip("m3bench.runtime.checkpoint")
    transformers = pytest.importorskip("transformers")
    from test_model_transformers import m3_config, randomize

    torch.manual_seed(0)
    hf = transformers.MiniMaxM3VLForCausalLM(m3_config()).double()
    randomize(hf, 1)
    hf.save_pretrained(tmp_path / "ckpt")
    ids = torch.randint(0, 512, (80,), generator=torch.Generator().manual_seed(0)).tolist()
    want = _two_ranks_vs_one(tmp_path, False, ids, str(tmp_path / "ckpt"))
    assert torch.allclose(torch.load(tmp_path / "logits.pt"), want, atol=1e-10, rtol=0)
