"""The draft's device work after a step, run identically on every rank: the extend over the newly verified
positions, then K - 1 chained single-token steps from the first draft token.

    d = DraftInputs(...)                      # rank 0 builds it from the landed step (SpecRunner.propose)
    tokens, q = run_draft(draft, store, capture.buffer, d, K, pick)

`pick(logits) -> (tokens [p] target ids, q [p, V] or None)` chooses each chain step's draft tokens. On rank 0
it samples (greedy or with the requests' generators) and hands the tokens to the other ranks
(`StepLink.picks`); on the other ranks it receives them. Either way the next chain step embeds the same
tokens on every rank. Everything else is a function of DraftInputs and each rank's own capture buffer
(the residual stream is replicated across ranks), so no features or hidden states cross the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.speculative.draft_kv import draft_slots

Pick = Callable[[torch.Tensor], tuple[torch.Tensor, "torch.Tensor | None"]]
ChainGraph = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                      tuple[torch.Tensor, "torch.Tensor | None"]]
PARTS = ("tok", "pos", "trow", "feat", "qsl", "lens", "last", "ends", "prow")  # int64 parts, in this order


@dataclass(frozen=True)
class DraftInputs:
    """One draft phase: the extend rows (one per request) and the proposing rows' chain."""

    tok: torch.Tensor  # [t] token at position p + 1 for each extend position p
    pos: torch.Tensor  # [t] extend positions
    trow: torch.Tensor  # [t] extend row of each token (a row of `tables`)
    feat: torch.Tensor  # [t] row of the capture buffer holding the target's feature at that position
    qsl: torch.Tensor  # [b + 1] cumulative extend lengths
    lens: torch.Tensor  # [b] draft KV length after the extend
    last: torch.Tensor  # [p] the last extend token of each proposing row
    ends: torch.Tensor  # [p] its length after the extend
    prow: torch.Tensor  # [p] its extend row
    tables: torch.Tensor  # [b, width] int32 draft page tables of the extend rows
    q_lens: list[int]  # host mirrors: extend lengths, KV lengths, the proposing rows' lengths
    lens_host: list[int]
    ends_host: list[int]

    @classmethod
    def from_flat(cls, flat: torch.Tensor, sizes: list[int], tables: torch.Tensor, q_lens: list[int],
                  lens_host: list[int], ends_host: list[int]) -> DraftInputs:
        """From one int64 tensor holding PARTS back to back (`sizes` long)."""
        return cls(*flat.split(sizes), tables, q_lens, lens_host, ends_host)

    def sizes(self) -> list[int]:
        return [getattr(self, name).shape[0] for name in PARTS]


def run_draft(draft: Any, store: Any, buffer: torch.Tensor, d: DraftInputs, K: int, pick: Pick,
              chain_graph: ChainGraph | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Draft tokens [p, K] of the proposing rows and their distributions [p, K, V] (None when greedy);
    (None, None) without proposing rows. `chain_graph(tok, feature, tables, ends)`: the captured chain
    steps 1..K-1 (TP 1 with CUDA graphs), else they run eagerly."""
    page = store.page_size
    meta = AttnMetadata(d.qsl.int(), d.lens.int(), d.tables, draft_slots(d.tables, d.trow, d.pos, page), d.pos,
                        d.q_lens, d.lens_host)
    out = draft(d.tok, d.pos, draft.combine_features(buffer[d.feat]), meta, store)
    if not d.ends_host:
        return None, None
    tables, feature = d.tables[d.prow], out.feature[d.last]
    tok, q = pick(draft.compute_logits(out.hidden[d.last]))
    if chain_graph is not None:
        rest, rest_q = chain_graph(tok, feature, tables, d.ends)
        return torch.cat((tok[:, None], rest), dim=1), None if q is None else torch.cat((q[:, None], rest_q), dim=1)
    toks, qs = [tok], [q]
    b = tok.shape[0]
    arange = torch.arange(b + 1, dtype=torch.int32, device=tok.device)
    for i in range(1, K):
        pos = d.ends - 1 + i
        slots = draft_slots(tables, arange[:b].long(), pos, page)
        step = AttnMetadata(arange, (d.ends + i).int(), tables, slots, pos, [1] * b, [e + i for e in d.ends_host])
        out = draft(tok, pos, feature, step, store)
        tok, q = pick(draft.compute_logits(out.hidden))
        feature = out.feature
        toks.append(tok)
        qs.append(q)
    return torch.stack(toks, dim=1), torch.stack(qs, dim=1) if qs[0] is not None else None
