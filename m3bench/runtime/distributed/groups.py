"""Process groups of one tensor-parallel run: the model group (NCCL on GPU, gloo on CPU) carries the
model's collectives and the step payload; a gloo control group carries rank 0's headers.

    groups = init_groups(rank=1, world=2, init_method="file:///tmp/m3bench-tp-x/rendezvous", device="cpu")
    groups.tp.all_reduce(x); groups.control      # a torch.distributed ProcessGroup
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from m3bench.runtime.errors import InputError
from m3bench.runtime.parallel import TPGroup

# A model collective that waits this long means a rank hangs (a dead rank is seen at once: its
# sockets close). Generous because the first steps may compile kernels on some ranks before others.
COLLECTIVE_TIMEOUT_S = 300.0
# Workers wait for rank 0's next header this long: an idle server sends none for hours.
CONTROL_TIMEOUT_S = 30 * 24 * 3600.0


@dataclass(frozen=True)
class RankGroups:
    tp: TPGroup  # the model group
    control: Any  # gloo ProcessGroup for the headers
    device: torch.device
    default_group: bool  # built on torch.distributed's default group (one per process) or standalone


def rank_device(device: str | torch.device, local_rank: int) -> torch.device:
    """cpu stays cpu; cuda / cuda:k on local rank r is cuda:(k + r)."""
    d = torch.device(device)
    if d.type != "cuda":
        return d
    index = (d.index or 0) + local_rank
    if index >= torch.cuda.device_count():
        raise InputError(f"rank {local_rank} needs cuda:{index} but {torch.cuda.device_count()} GPUs are visible")
    return torch.device("cuda", index)


def init_groups(rank: int, world: int, init_method: str, device: torch.device) -> RankGroups:
    """This rank's groups. On CPU with a file:// rendezvous they are standalone gloo groups, so several
    tensor-parallel LLMs can live in one process; otherwise (NCCL, torchrun) the default process group
    (one per process) carries the model and a gloo group made from it the control messages."""
    if device.type == "cpu" and init_method.startswith("file://"):
        return _standalone_gloo(rank, world, init_method[len("file://"):], device)
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        extra = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S), **extra)
    elif init_method != "env://":
        raise InputError("torch.distributed is already initialised in this process (another tensor-parallel "
                         "LLM on GPUs?): shut it down first")
    elif dist.get_world_size() != world:
        raise InputError(f"torch.distributed is already initialised with world {dist.get_world_size()}, "
                         f"not tensor_parallel_size {world}")
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=CONTROL_TIMEOUT_S))
    return RankGroups(TPGroup.from_torch_distributed(), control, device, True)


def _standalone_gloo(rank: int, world: int, path: str, device: torch.device) -> RankGroups:
    import torch.distributed as dist

    store = dist.FileStore(path, world)
    model = dist.ProcessGroupGloo(dist.PrefixStore("model", store), rank, world,
                                  timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, world,
                                    timedelta(seconds=CONTROL_TIMEOUT_S))
    return RankGroups(TPGroup(rank, world, model), control, device, False)


def torchrun_rank(world: int) -> tuple[int, int] | None:
    """(rank, local rank) when this process was started by torchrun for `world` ranks, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    size = int(os.environ["WORLD_SIZE"])
    if size != world:
        raise InputError(f"torchrun started {size} processes but tensor_parallel_size is {world}")
    return int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))


def destroy_groups(groups: RankGroups) -> None:
    """Release the default process group if these groups live on it (standalone ones just go away)."""
    import torch.distributed as dist

    if groups.default_group and dist.is_initialized():
        dist.destroy_process_group()
