"""Host -> device copies that do not wait for the device's queue (what overlap scheduling needs).

    ids = upload(torch.tensor(host_ids), device)        # or upload_list(host_ids, torch.int64, device)

`tensor.to(cuda)` waits for the stream; so may `to(cuda, non_blocking=True)` from pageable memory (the
driver stages it through pinned memory and may synchronize with the stream to do so). The copies here go
through pinned memory; torch's caching host allocator keeps a pinned block until the copy reading it ran.
"""

from __future__ import annotations

from typing import Sequence

import torch


def upload(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, queued on the current stream without a host wait."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload_list(values: Sequence, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A small host list on `device` (torch.tensor(values, device=...) would wait for the stream)."""
    return upload(torch.tensor(values, dtype=dtype), device)
