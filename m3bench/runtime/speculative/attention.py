"""The draft layer's paged KV: the `KVCache` interface (`write` / `gather`) for one extra dense layer.

    kv = DraftKV(num_pages=64, page_size=32, num_kv_heads=4, head_dim=128, kv_dtype=KVDtype.BF16,
                 dtype=torch.bfloat16)
    kv.write(0, k, v, None, meta.slot_mapping); k, v, _ = kv.gather(0, meta.block_tables[b], seq_len)

SEPARATE layout: the draft's own pool (`num_pages`, page size 32 by default) with its own block
tables and slot mapping in the draft step's AttnMetadata.
SHARED layout: the target's pool folded in as one more layer: `num_pages` and `page_size` equal
the target's, and the draft step reuses the target's page ids (block tables, slot mapping), so
page n lives and dies with the target's page n. The draft layer stores like a dense layer of the
target (`layer_format(kv_dtype, DENSE)`: FP8 under HYBRID, as TensorRT-LLM does).
"""

from __future__ import annotations

import torch

from m3bench.runtime.config import AttnKind
from m3bench.runtime.kv_cache import KVDtype, PageStore, layer_format


class DraftKV:
    """K and V pages of the draft layer, each [pages, Hkv, P, d] in the layer's storage format."""

    def __init__(self, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, kv_dtype: KVDtype,
                 dtype: torch.dtype, device: torch.device | str = "cpu", nvfp4_global_scale: float = 1.0):
        self.num_pages, self.page_size, self.dtype = num_pages, page_size, dtype
        fmt = layer_format(kv_dtype, AttnKind.DENSE)
        plain = dtype if kv_dtype is KVDtype.AUTO else torch.bfloat16
        shape = (num_pages, num_kv_heads, page_size, head_dim)
        self.k = PageStore(shape, fmt, plain, device, nvfp4_global_scale)
        self.v = PageStore(shape, fmt, plain, device, nvfp4_global_scale)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, ik: torch.Tensor | None,
              slot_mapping: torch.Tensor) -> None:
        """k, v [T, Hkv, d] to slot page * P + offset of each token (layer must be 0, ik None)."""
        _check_layer(layer)
        page, off = slot_mapping // self.page_size, slot_mapping % self.page_size
        self.k.write((page, slice(None), off), k)
        self.v.write((page, slice(None), off), v)

    def gather(self, layer: int, block_table_row: torch.Tensor, length: int
               ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """A sequence's first `length` tokens: k, v [Hkv, length, d] in the compute dtype."""
        _check_layer(layer)
        pages = block_table_row[:-(-length // self.page_size)].long()
        k = self.k.read(pages, self.dtype).transpose(0, 1).flatten(1, 2)[:, :length]
        v = self.v.read(pages, self.dtype).transpose(0, 1).flatten(1, 2)[:, :length]
        return k, v, None

    def pages(self, layer: int):
        """Raw paged K and V (no index keys) for the GPU kernels, as KVCache.pages gives them."""
        _check_layer(layer)
        return self.k.paged(), self.v.paged(), None

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def _check_layer(layer: int) -> None:
    if layer != 0:
        raise IndexError(f"the draft KV holds one layer (0), not layer {layer}")
