"""Tensor-parallel group: rank, world size and the two collectives the model needs.

World 1 (the default) does no communication at all; a larger world runs on an initialised
torch.distributed process group (gloo on CPU, NCCL on GPU).

    tp = TPGroup.from_torch_distributed()     # after torch.distributed.init_process_group
    y = tp.all_reduce(partial_sum)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    world: int = 1
    group: Any = None  # torch.distributed ProcessGroup; None means the default group

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} outside world {self.world}")

    @classmethod
    def from_torch_distributed(cls, group: Any = None) -> "TPGroup":
        import torch.distributed as dist

        return cls(rank=dist.get_rank(group), world=dist.get_world_size(group), group=group)

    def shard_size(self, n: int, what: str = "dimension") -> int:
        """n / world, refusing sizes that do not split evenly."""
        if n % self.world:
            raise ValueError(f"{what} {n} does not split over tensor-parallel world {self.world}")
        return n // self.world

    def head_split(self, n: int, what: str = "heads") -> tuple[int, int]:
        """(piece, pieces) of n heads over the world: n / world heads a rank, or, when n < world, one
        head duplicated on world / n consecutive ranks (rank r holds head r // (world / n))."""
        pieces = min(self.world, n)
        if n % pieces or self.world % pieces:
            raise ValueError(f"{what} {n} neither split over nor divide tensor-parallel world {self.world}")
        return self.rank * pieces // self.world, pieces

    def expert_range(self, num_experts: int) -> tuple[int, int]:
        """(first expert, experts per rank) this rank owns under expert parallelism."""
        n = self.shard_size(num_experts, "num_experts")
        return self.rank * n, n

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the group, in place; x itself at world 1."""
        if self.world == 1:
            return x
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenation of every rank's x along dim, in rank order."""
        if self.world == 1:
            return x
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)


def vocab_parallel_embedding(input_ids: torch.Tensor, shard: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """[T] ids -> [T, H] rows of an embedding whose vocabulary is split over tp (this rank holds
    rows [rank V/N, (rank+1) V/N) as `shard`): masked local lookup, zeros elsewhere, then a sum."""
    import torch.nn.functional as F

    if tp.world == 1:
        return F.embedding(input_ids, shard)
    n = shard.shape[0]
    local = input_ids - tp.rank * n
    mine = (local >= 0) & (local < n)
    h = F.embedding(torch.where(mine, local, 0), shard).masked_fill_(~mine[:, None], 0)
    return tp.all_reduce(h)


SINGLE = TPGroup()
