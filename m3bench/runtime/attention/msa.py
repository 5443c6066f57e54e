"""MSA (MiniMax sparse attention) block selection, in plain torch.

Per index head h (= KV head h), query token i at position p_i and key block b of `block` tokens:
    M[h, i, b] = max over keys j in b with j <= p_i of iq[i, h] . ik[j]          (fp32)
The block holding p_i (and the `local_blocks - 1` before it) is forced to 1e29, the first
`init_blocks` blocks to 1e30; the top `topk_blocks` blocks are kept, `-1` padded. Query i then
attends only the keys of its selected blocks, causally (j <= p_i).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from m3bench.runtime.config import MsaConfig
from m3bench.runtime.layers.norm import compute_dtype

LOCAL_SCORE = 1e29
INIT_SCORE = 1e30


def num_blocks(length: int, block: int) -> int:
    return -(-length // block)


def block_scores(iq: torch.Tensor, ik: torch.Tensor, positions: torch.Tensor, block: int) -> torch.Tensor:
    """iq [q, H, di], ik [S, di], positions [q] -> M [q, H, ceil(S / block)] (-inf: no key j <= p)."""
    ct = compute_dtype(iq.dtype)
    s = torch.einsum("qhd,sd->qhs", iq.to(ct), ik.to(ct))
    keys = torch.arange(ik.shape[0], device=ik.device)
    s = s.masked_fill(keys[None, None, :] > positions[:, None, None], float("-inf"))
    nb = num_blocks(ik.shape[0], block)
    s = F.pad(s, (0, nb * block - ik.shape[0]), value=float("-inf"))
    return s.unflatten(-1, (nb, block)).amax(-1)


def select_blocks(scores: torch.Tensor, positions: torch.Tensor, m: MsaConfig) -> torch.Tensor:
    """M [q, H, nb] -> selected block ids [q, H, topk_blocks] int64, highest score first, -1 padded."""
    q, h, nb = scores.shape
    s = scores.clone()
    cur = positions // m.block_size
    for back in range(m.local_blocks):
        idx = (cur - back).clamp(min=0)[:, None, None].expand(q, h, 1)
        s.scatter_(-1, idx, LOCAL_SCORE)
    if m.init_blocks:
        head = s[..., :m.init_blocks]
        s[..., :m.init_blocks] = torch.where(torch.isfinite(head), INIT_SCORE, head)
    k = min(m.topk_blocks, nb)
    vals, ids = s.topk(k, dim=-1)
    ids = ids.masked_fill(vals == float("-inf"), -1)
    return F.pad(ids, (0, m.topk_blocks - k), value=-1)


def selection_mask(selected: torch.Tensor, positions: torch.Tensor, length: int, block: int) -> torch.Tensor:
    """Selected ids [q, H, k] -> allowed keys [q, H, length] bool (selected blocks, j <= p)."""
    q, h, _ = selected.shape
    nb = num_blocks(length, block)
    by_block = torch.zeros((q, h, nb + 1), dtype=torch.bool, device=selected.device)
    by_block.scatter_(-1, selected.masked_fill(selected < 0, nb), True)
    keys = torch.arange(length, device=selected.device)
    allowed = by_block[..., keys // block]
    return allowed & (keys[None, None, :] <= positions[:, None, None])
