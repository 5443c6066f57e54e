"""Which implementation a kernel wrapper runs: Triton (CUDA, or CPU under TRITON_INTERPRET=1)
or the plain-torch reference (the CPU fallback)."""

from __future__ import annotations

import functools
import os
from enum import Enum

import torch

from m3bench.runtime.errors import InputError
from m3bench.runtime.kernels.kv_quant import (
    KVFormat,
    Nvfp4Pages,
    PagedTensor,
    kv_format_of,
)

WHOLE_PAGE_ROWS = 32  # programs of up to this many query rows step a whole KV page (<= 128 keys) at a time in the
#                       attention and index kernels (their [rows, keys] fp32 scores live in registers); more keep 64


class KernelBackend(Enum):
    AUTO = "auto"  # Triton on CUDA tensors, torch elsewhere
    TRITON = "triton"
    TORCH = "torch"


def use_triton(backend: KernelBackend, t: torch.Tensor) -> bool:
    """Resolve AUTO against the tensor's device."""
    if backend is KernelBackend.AUTO:
        return t.is_cuda
    return backend is KernelBackend.TRITON


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def target_programs(t: torch.Tensor) -> int:
    """About two waves of programs on the device (a fixed 8 on CPU, to exercise splitting)."""
    return 2 * sm_count(t.device.index or 0) if t.is_cuda else 8


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def prev_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def global_scale_tensor(gs, device) -> torch.Tensor:
    """A 1-element fp32 device tensor for an NVFP4 global scale (a float is copied once per call)."""
    if isinstance(gs, torch.Tensor):
        return gs.reshape(1).to(device=device, dtype=torch.float32)
    return torch.tensor([gs], dtype=torch.float32, device=device)


FMT_CODE = {KVFormat.PLAIN: 0, KVFormat.FP8: 1, KVFormat.NVFP4: 2}  # kv_tiles_triton.FMT_*


class Nvfp4Decode(Enum):
    """How the attention / index kernels turn NVFP4 bytes into fp16 (kv_tiles_triton.load_kv_tile)."""

    ASM = "asm"  # four bytes a register in PTX (CUDA sm89+; the interpreter and fp32 runs take CVT)
    CVT = "cvt"  # per byte: integer ops to e4m3 codes, Triton's fp8 conversion


# The process-wide choice (benchmarks/nvfp4_kv.py times both). ASM since it passed its checks on the H200
# (2026-12-02: tests/runtime/kernel_tests/test_e2m1_decode.py -m gpu, all 256 bytes exact; the NVFP4 attention and
# index kernels at rank shapes against torch, test_fused_kernels_gpu.py) and ran faster there: at batch 32 the
# attention kernels 1.15-1.46x faster than CVT, a 60-layer step's attention 1.32x (32k) and 1.40x (128k).
# The interpreter cannot run inline PTX: CPU tests cover CVT.
NVFP4_DECODE = {"decode": Nvfp4Decode.ASM}


@functools.cache
def sm_capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def nvfp4_asm(t: torch.Tensor) -> bool:
    """Whether a kernel on t (the queries) decodes NVFP4 with the PTX variant: chosen, CUDA sm89+, not fp32."""
    return (NVFP4_DECODE["decode"] is Nvfp4Decode.ASM and t.is_cuda and not interpreting()
            and t.dtype != torch.float32 and sm_capability(t.device.index or 0) >= (8, 9))


class Pdl(Enum):
    """Programmatic dependent launch of the runtime's Triton kernels (CUDA sm90+; kernels/pdl_triton.py): each
    kernel may start while the one before it in the stream finishes, and waits before touching global memory."""

    OFF = "off"
    ON = "on"  # wait, then let the next kernel launch
    EARLY = "early"  # let the next kernel launch, then wait (pdl_probe.py: 1.01 against 1.12 us a tiny launch)


PDL_CODE = {Pdl.OFF: 0, Pdl.ON: 1, Pdl.EARLY: 2}  # the kernels' PDL constexpr (pdl_triton.pdl_wait)

# The default. H200, 60-layer TP8/EP8 rank decode step at 8k (benchmarks/decode_step.py --ops-sets skinny skinny-pdl
# skinny-pdl-early, 2026-12-03): B1 realistic 5.175 ms off, 4.511 on, 4.818 early; B1 all-local 10.275 / 9.699 /
# 10.070; B64 unchanged (26.00 / 26.04 / 26.04). Steps bit-identical in every mode (tests/benchmarks/test_decode_pdl_gpu.py).
PDL_DEFAULT = Pdl.ON
PDL_ENV_VAR = "M3BENCH_PDL"  # off / on / early: this process's choice instead (e.g. a GPU test run with PDL on)


def pdl_from_env() -> Pdl:
    """PDL_ENV_VAR's mode, PDL_DEFAULT when unset."""
    raw = os.environ.get(PDL_ENV_VAR, PDL_DEFAULT.value)
    try:
        return Pdl(raw)
    except ValueError:
        raise InputError(f"{PDL_ENV_VAR}={raw!r}: expected one of {[p.value for p in Pdl]}") from None


PDL = {"launch": pdl_from_env()}  # the process-wide choice (read once; benchmarks switch it in place)


def pdl_device(t: torch.Tensor) -> bool:
    """Whether kernels on t's device can launch with PDL: CUDA sm90+ (the interpreter cannot run its PTX)."""
    return t.is_cuda and not interpreting() and sm_capability(t.device.index or 0) >= (9, 0)


def pdl_launch(t: torch.Tensor) -> bool:
    """Whether a kernel launched on t's device launches with PDL: chosen (PDL) and possible there."""
    return PDL["launch"] is not Pdl.OFF and pdl_device(t)


def pdl_args(t: torch.Tensor) -> dict:
    """The keywords every Triton launch passes, `kernel[grid](..., **pdl_args(t))`: the kernel's PDL code and,
    when on, launch_pdl (left out when off, so Triton builds without that option stay as they were)."""
    if not pdl_launch(t):
        return {"PDL": 0}
    return {"PDL": PDL_CODE[PDL["launch"]], "launch_pdl": True}


def cache_kernel_args(cache: PagedTensor):
    """(data, scales, global scale) tensors for the kernel; dummies where a format has none."""
    fmt = kv_format_of(cache)
    if fmt is KVFormat.NVFP4:
        assert isinstance(cache, Nvfp4Pages)
        gs = global_scale_tensor(cache.global_scale, cache.device)
        return cache.data, cache.scales.view(torch.uint8), gs
    data = cache.view(torch.uint8) if fmt is KVFormat.FP8 else cache
    return data, data, data


def scale_row_strides(cache: PagedTensor) -> tuple[int, ...]:
    """The strides of cache_kernel_args' scales but the last, in rows of d/16 scales, as the kernels take
    them (kv_tiles_triton.load_nvfp4_halves: a row index times d/16 shows Triton where each row starts);
    checks that each token's d/16 scales are contiguous at a multiple of d/16. Zeros for formats with no scales."""
    if kv_format_of(cache) is not KVFormat.NVFP4:
        return (0,) * (len(cache.shape) - 1)
    scales = cache.scales
    per_row = scales.shape[-1]
    lead = [(st, size) for st, size in zip(scales.stride()[:-1], scales.shape[:-1])]
    if scales.stride(-1) != 1 or any(st % per_row for st, size in lead if size > 1):  # a dim of 1 is never stepped
        raise ValueError(f"NVFP4 scales must be rows of {per_row} contiguous bytes at multiples of {per_row}, "
                         f"got strides {scales.stride()}")
    return tuple(st // per_row if size > 1 else 0 for st, size in lead)
