"""Paged KV cache: per layer K and V `[pages, Hkv, P, d]` and, on MSA layers, the index key `[pages, P, di]`.

Page id n is the same slot in every layer (one allocation per layer, one lifetime). Storage
formats: the compute dtype itself (AUTO), bf16, FP8 e4m3 (unscaled cast) or NVFP4 (two E2M1 a
byte plus one e4m3 scale per 16 elements and an fp32 global scale); HYBRID keeps MSA layers
NVFP4 and dense layers FP8. Quantisation happens on write, dequantisation on read.

    kv = KVCache(cfg, num_pages=64, tokens_per_block=128, kv_dtype=KVDtype.BF16, dtype=torch.bfloat16)
    kv.write(layer, k, v, ik, meta.slot_mapping)
    k, v, ik = kv.gather(layer, meta.block_tables[b], meta.seq_lens_host[b])
"""

from __future__ import annotations

from enum import Enum

import torch

from m3bench.runtime.config import AttnKind, ModelConfig
from m3bench.runtime.kernels import kv_quant
from m3bench.runtime.parallel import SINGLE, TPGroup


class KVDtype(Enum):
    AUTO = "auto"  # the model's compute dtype, unquantised (fp32 caches for exact tests)
    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    HYBRID = "hybrid"  # MSA layers NVFP4, dense layers FP8


class PageFormat(Enum):
    """How one layer stores its pages."""

    PLAIN = "plain"
    FP8 = "fp8"
    NVFP4 = "nvfp4"


def layer_format(kv_dtype: KVDtype, kind: AttnKind) -> PageFormat:
    if kv_dtype is KVDtype.HYBRID:
        return PageFormat.NVFP4 if kind is AttnKind.MSA else PageFormat.FP8
    return {KVDtype.FP8: PageFormat.FP8, KVDtype.NVFP4: PageFormat.NVFP4}.get(kv_dtype, PageFormat.PLAIN)


class PageStore:
    """One paged tensor `[pages, *inner]` (inner = (Hkv, P, d) or (P, di)) in one storage format."""

    def __init__(self, shape: tuple[int, ...], fmt: PageFormat, plain_dtype: torch.dtype, device,
                 global_scale: float):
        self.fmt = fmt
        self.global_scale = torch.tensor([global_scale], dtype=torch.float32, device=device)
        *lead, d = shape
        if fmt is PageFormat.NVFP4:
            self.data = torch.zeros((*lead, d // 2), dtype=torch.uint8, device=device)
            self.scales = torch.zeros((*lead, d // 16), dtype=torch.float8_e4m3fn, device=device)
        else:
            dt = torch.float8_e4m3fn if fmt is PageFormat.FP8 else plain_dtype
            self.data = torch.zeros(shape, dtype=dt, device=device)
            self.scales = None

    def write(self, index: tuple, x: torch.Tensor) -> None:
        if self.fmt is PageFormat.NVFP4:
            data, scales = kv_quant.quantize_nvfp4(x, self.global_scale)
            self.data[index] = data
            self.scales[index] = scales
        elif self.fmt is PageFormat.FP8:
            self.data[index] = kv_quant.quantize_fp8(x)
        else:
            self.data[index] = x.to(self.data.dtype)

    def read(self, pages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.fmt is PageFormat.NVFP4:
            return kv_quant.dequantize_nvfp4(self.data[pages], self.scales[pages], self.global_scale, dtype)
        if self.fmt is PageFormat.FP8:
            return kv_quant.dequantize_fp8(self.data[pages], dtype)
        return self.data[pages].to(dtype)

    def paged(self) -> kv_quant.PagedTensor:
        """The storage as the kernels take it: the tensor itself, or Nvfp4Pages for NVFP4."""
        if self.fmt is PageFormat.NVFP4:
            return kv_quant.Nvfp4Pages(self.data, self.scales, self.global_scale)
        return self.data

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.data.numel() * self.data.element_size() + extra


class KVCache:
    def __init__(self, cfg: ModelConfig, num_pages: int, tokens_per_block: int, kv_dtype: KVDtype,
                 dtype: torch.dtype, device: torch.device | str = "cpu", tp: TPGroup = SINGLE,
                 nvfp4_global_scale: float = 1.0):
        self.cfg, self.num_pages, self.page_size, self.kv_dtype = cfg, num_pages, tokens_per_block, kv_dtype
        self.dtype = dtype  # compute dtype returned by gather
        plain = dtype if kv_dtype is KVDtype.AUTO else torch.bfloat16
        hkv = cfg.num_kv_heads // tp.head_split(cfg.num_kv_heads, "num_key_value_heads")[1]  # local (maybe duplicated)
        kv_shape = (num_pages, hkv, tokens_per_block, cfg.head_dim)
        self.formats = [layer_format(kv_dtype, kind) for kind in cfg.attn_kinds]
        self.k = [PageStore(kv_shape, f, plain, device, nvfp4_global_scale) for f in self.formats]
        self.v = [PageStore(kv_shape, f, plain, device, nvfp4_global_scale) for f in self.formats]
        self.ik: list[PageStore | None] = [
            PageStore((num_pages, tokens_per_block, cfg.msa.index_dim), f, plain, device, nvfp4_global_scale)
            if kind is AttnKind.MSA else None for f, kind in zip(self.formats, cfg.attn_kinds)]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, ik: torch.Tensor | None,
              slot_mapping: torch.Tensor) -> None:
        """k, v [T, Hkv, d], ik [T, di] (MSA layers) go to slot page * P + offset of each token."""
        page, off = slot_mapping // self.page_size, slot_mapping % self.page_size
        self.k[layer].write((page, slice(None), off), k)
        self.v[layer].write((page, slice(None), off), v)
        store = self.ik[layer]
        if store is not None:
            if ik is None:
                raise ValueError(f"layer {layer} is an MSA layer: write() needs its index keys")
            store.write((page, off), ik)

    def gather(self, layer: int, block_table_row: torch.Tensor, length: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A sequence's first `length` tokens: k, v [Hkv, length, d] and ik [length, di] (or None)."""
        n = -(-length // self.page_size)
        pages = block_table_row[:n].long()
        k = self._flatten(self.k[layer].read(pages, self.dtype), length)
        v = self._flatten(self.v[layer].read(pages, self.dtype), length)
        store = self.ik[layer]
        ik = None if store is None else store.read(pages, self.dtype).flatten(0, 1)[:length]
        return k, v, ik

    def pages(self, layer: int) -> tuple[kv_quant.PagedTensor, kv_quant.PagedTensor, kv_quant.PagedTensor | None]:
        """One layer's raw paged K, V (and index keys) for the GPU kernels (m3bench.runtime.kernels)."""
        store = self.ik[layer]
        return self.k[layer].paged(), self.v[layer].paged(), None if store is None else store.paged()

    @staticmethod
    def _flatten(x: torch.Tensor, length: int) -> torch.Tensor:
        """[n, Hkv, P, d] -> [Hkv, n * P, d][:, :length]."""
        return x.transpose(0, 1).flatten(1, 2)[:, :length]

    @property
    def nbytes(self) -> int:
        stores = [*self.k, *self.v, *(s for s in self.ik if s is not None)]
        return sum(s.nbytes for s in stores)

    @classmethod
    def page_bytes(cls, cfg: ModelConfig, tokens_per_block: int, kv_dtype: KVDtype, dtype: torch.dtype,
                   tp: TPGroup = SINGLE) -> int:
        """Bytes one page costs over all layers (for sizing the pool), measured on a one-page cache."""
        return cls(cfg, 1, tokens_per_block, kv_dtype, dtype, "meta", tp).nbytes
