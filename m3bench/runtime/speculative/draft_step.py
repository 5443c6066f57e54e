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
    b = tok.shape[0]
    arange = torch.arange(b + 1, dtype=torch.int32, device=tok.device)
    rest, rest_q = chain_steps(draft, store, tok, feature, tables, d.ends, d.ends_host, K, lambda lg, i: pick(lg),
                               arange)
    toks, qs = [tok] + rest, [q] + rest_q
    return torch.stack(toks, dim=1), torch.stack(qs, dim=1) if qs[0] is not None else None


def chain_steps(draft: Any, store: Any, tok: torch.Tensor, feature: torch.Tensor, tables: torch.Tensor,
                ends: torch.Tensor, ends_host: list[int], K: int, pick: Callable[[torch.Tensor, int], tuple],
                arange: torch.Tensor) -> tuple[list[torch.Tensor], list]:
    """Chain steps i = 1..K-1 of b rows from draft token `tok` [b] and its feature: step i feeds the last
    pick at position ends - 1 + i; `pick(logits, i)` -> (tokens [b], q or None). arange: int32 [>= b + 1]."""
    b, page = tok.shape[0], store.page_size
    rows, toks, qs = arange[:b].long(), [], []
    for i in range(1, K):
        pos = ends - 1 + i
        meta = AttnMetadata(arange[:b + 1], (ends + i).int(), tables, draft_slots(tables, rows, pos, page), pos,
                            [1] * b, [e + i for e in ends_host])
        out = draft(tok, pos, feature, meta, store)
        tok, q = pick(draft.compute_logits(out.hidden), i)
        feature = out.feature
        toks.append(tok)
        qs.append(q)
    return toks, qs


def draft_verified(draft: Any, store: Any, features: torch.Tensor, emitted: torch.Tensor, pos: torch.Tensor,
                   accepted: torch.Tensor, tables: torch.Tensor, trow: torch.Tensor, qsl: torch.Tensor,
                   lens_host: list[int], ends_host: list[int], K: int, pick: Callable[[torch.Tensor, int], tuple],
                   arange: torch.Tensor) -> list[torch.Tensor]:
    """The whole draft of B verify rows from their verification, K draft tokens [B] each: first the extend over
    each row's q = K + 1 positions [L, L + K] at a fixed shape (tokens = the verify's emitted ones: accepted
    drafts, the bonus, -1 padding -> 0; features = the verify rows' captured residuals [B q, n, Ht]), its pick
    at each row's last accepted position L + a (`pick(logits, 0)`), then chain_steps from L' = L + a + 1. The
    padding positions >= L' write KV that the chain overwrites or that lies past the length; causal attention
    keeps it from the real positions. trow [B q] the row of each token, qsl [B + 1] int32 = row * q, arange
    int32 [>= B + 1] (the chain's); lens_host / ends_host: the backend's host mirrors of the extend and chain."""
    B = accepted.shape[0]
    q = pos.shape[0] // B
    start = pos.view(B, q)[:, 0]
    meta = AttnMetadata(qsl, (start + q).int(), tables, draft_slots(tables, trow, pos, store.page_size), pos,
                        [q] * B, lens_host)
    out = draft(emitted.reshape(-1).clamp_min(0), pos, draft.combine_features(features), meta, store)
    last = qsl[:B].long() + accepted
    tok, _ = pick(draft.compute_logits(out.hidden[last]), 0)
    rest, _ = chain_steps(draft, store, tok, out.feature[last], tables, start + accepted + 1, ends_host, K, pick,
                          arange)
    return [tok] + rest
