"""The bandwidth every benchmark's floor reads its bytes at, measured on the GPU it runs on.

    line = use_device_bandwidth(torch.device("cuda"))   # once, at a GPU run's start: "floor bandwidth ..."
    decode_floor.peak_bytes_per_s()                      # what the floors divide by from then on

The rate is a device-to-device copy's (bytes read + written a second; the median of 10 copies of 2 GiB after two
warm-ups, CUDA events): an achievable rate on that card, not its datasheet peak. An H200 copies at about 4.3 TB/s
(the default, decode_floor.BANDWIDTH), an H100 at about 3.0, so a row's "% of floor" means the same on either card.
"""

from __future__ import annotations

import torch
from decode_floor import peak_bytes_per_s, peak_source, set_peak_bytes_per_s

COPY_BYTES = 2 << 30
COPIES = 10


def measure_copy_bytes_per_s(device: torch.device, nbytes: int = COPY_BYTES, copies: int = COPIES) -> float:
    """The median rate of `copies` device-to-device copies of nbytes (bytes read + written a second)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times = []
    for _ in range(copies):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / sorted(times)[len(times) // 2]


def use_device_bandwidth(device: torch.device | str) -> str:
    """On CUDA: measure the device's copy rate and make it the floors' bandwidth; elsewhere keep the default.
    Returns a line saying which bandwidth the floors use."""
    device = torch.device(device)
    if device.type == "cuda":
        rate = measure_copy_bytes_per_s(device)
        set_peak_bytes_per_s(rate, f"a device-to-device copy on {torch.cuda.get_device_name(device)}, this run")
    return f"floor bandwidth {peak_bytes_per_s() / 1e12:.2f} TB/s ({peak_source()})"
