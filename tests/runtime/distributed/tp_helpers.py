"""Tiny MiniMax-M3 checkpoints for the tensor-parallel tests (CPU, gloo, 2 ranks).

MSA block 16 with top-2 blocks: selection is active past 32 tokens; 4 routed experts (2 per rank
under expert parallelism); vocabulary 512 (256 rows per rank).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import torch

from m3bench.runtime.tiny import TinySpec, write_tiny_checkpoint

TP_SPEC = TinySpec(vocab_size=512, hidden_size=64, num_layers=3, num_dense_layers=1, num_heads=4, num_kv_heads=2,
                   head_dim=16, rotary_dim=8, dense_intermediate_size=96, num_experts=4, top_k=2,
                   intermediate_size=32, shared_intermediate_size=32, index_dim=16, block_size=16, topk_blocks=2,
                   max_position_embeddings=1024)
ONE_KV_HEAD = dataclasses.replace(TP_SPEC, num_kv_heads=1)  # duplicated on both ranks at TP 2
P = 16  # KV page = MSA block


def tiny_checkpoint(dest: Path, spec: TinySpec = TP_SPEC, seed: int = 0) -> Path:
    return write_tiny_checkpoint(dest, seed=seed, spec=spec)


def random_prompts(lengths: list[int], seed: int = 0, vocab: int = 500) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def checkpoint_and_draft(root: Path) -> tuple[Path, Path]:
    """A tiny TP checkpoint under root/target and a random Eagle3 draft for it under root/draft."""
    from m3bench.runtime.speculative.tiny_draft import write_tiny_draft

    target = tiny_checkpoint(root / "target")
    write_tiny_draft(root / "draft", target, seed=3)
    return target, root / "draft"
