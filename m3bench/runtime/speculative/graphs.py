"""CUDA graphs of the speculative decode step: the target's verify forward and the draft's chained steps.

    graphs = SpecGraphs(spec_runner, scratch_page=num_blocks, draft_scratch_page=layout.store.num_pages - 1,
                        max_batch_size=64)
    graphs.capture()                       # every padded size 1, 2, 4, 8, 16, ... (engine.graph_batch_sizes)
    spec_runner.graphs = graphs            # run_target / _chain then replay where the step fits

Verify graph (size Bp): Bp rows of 1 + K tokens (a pure-decode step: every row verifies K drafts),
the target forward with the feature capture, the logits of all Bp (1 + K) rows and their greedy
verification (`greedy_result`); synthetic acceptance runs eagerly on the graph's logits. Steps carrying
prefill chunks, plain or scoring rows run eagerly.
Sampled verification graph (size Bp, with or without top-k / top-p): rejection sampling on the verify
graph's logits (target_distribution_rows + verify_sampled), its inputs (temperature, top-k, top-p,
greedy rows, the uniforms drawn in the eager order, the drafts' distributions q) in static buffers.
Chain graph (size Bp, greedy or sampled): the draft's K - 1 chained single-token steps from the
first draft token and feature (after an eager extend over the accepted positions: its shape varies).
Sampled chains take their exponential noise from static buffers filled before the replay from each
request's generator, in the eager path's order: the same draws, the same tokens.
Early graph (size Bp, greedy or sampled; overlap, SpecRunner.draft_early): the whole draft of a pure-verify step from
its verification on the device (draft_step.draft_verified: the extend over each verify row's K + 1
positions at a fixed shape, the first pick at the last accepted one, the K - 1 chained steps); launched
before the host lands the step.

Static buffers hold every input; block tables are copied on the device into a static table (the
target's rows for the verify graph, the layout's draft table for the chain: a view of the target's
device table under SHARED, the separate pool's under SEPARATE), so requests need not sit in rows
0..B-1. Padding rows B..Bp-1 read and write only a scratch page no request owns (token 0, positions
from 0). The attention backends must be graph safe (no host reads): the host mirrors in the captured
metadata are those of capture time. On a CPU device nothing is captured: `replay` calls the same
functions on the same static buffers (with current host mirrors), which tests the buffer logic.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.engine import graph_batch_sizes
from m3bench.runtime.speculative.draft_step import chain_steps, draft_verified
from m3bench.runtime.speculative.propose import draw_from_noise
from m3bench.runtime.speculative.verify import (
    VerifyResult,
    filtered,
    sampling_rows,
    target_distribution_rows,
    verify_greedy,
    verify_sampled,
)
from m3bench.runtime.transfer import upload_list


class _Graph:
    """One captured function (CUDA), or the function itself (CPU)."""

    def __init__(self, fn: Callable[[], None], device: torch.device, pool: Any) -> None:
        self.fn, self.graph = fn, None
        if device.type != "cuda":
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up (Triton compiles, cuBLAS picks kernels): writes only scratch pages
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            fn()

    def replay(self) -> None:
        if self.graph is None:
            self.fn()
        else:
            self.graph.replay()


class SpecGraphs:
    def __init__(self, runner: Any, scratch_page: int, draft_scratch_page: int, max_batch_size: int) -> None:
        self.r, self.K = runner, runner.K
        self.sizes = graph_batch_sizes(max_batch_size)
        self.replays = {"verify": 0, "sampled": 0, "chain": 0, "early": 0}  # replay counters (tests, benchmarks)
        self._verify: dict[int, _Graph] = {}
        self._chain: dict[tuple[int, bool], _Graph] = {}
        self._early: dict[tuple[int, bool], _Graph] = {}
        self._sampled: dict[tuple[int, bool], _Graph] = {}
        self.last_early: tuple[int, bool] | None = None  # the last early replay's (size, sampled) (benchmarks)
        self._host: dict[str, list[int]] = {}
        self._alloc_target(scratch_page)
        self._alloc_draft(draft_scratch_page)

    # ---- static buffers ------------------------------------------------------------------------
    def _alloc_target(self, scratch_page: int) -> None:
        r, n, q = self.r, self.sizes[-1], self.K + 1
        dev, P = r.bm.table.device, r.bm.P
        self.scratch_page = scratch_page
        self.pad_pos = torch.arange(q, dtype=torch.int64, device=dev).repeat(n)
        self.pad_slots = scratch_page * P + self.pad_pos % P
        self.ids = torch.zeros(n * q, dtype=torch.int64, device=dev)
        self.pos = self.pad_pos.clone()
        self.slots = self.pad_slots.clone()
        self.lens = torch.full((n,), q, dtype=torch.int32, device=dev)
        self.qsl = (torch.arange(n + 1, dtype=torch.int32, device=dev) * q).int()
        self.tab = torch.full((n, r.bm.table.shape[1]), scratch_page, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(n * q, r.model.cfg.vocab_size, dtype=torch.float32, device=dev)
        self.drafts = torch.zeros(n, self.K, dtype=torch.int64, device=dev)  # greedy verification in the graph
        self.num_draft = torch.full((n,), self.K, dtype=torch.int64, device=dev)
        self.accepted = torch.zeros(n, dtype=torch.int64, device=dev)
        self.emitted = torch.full((n, q), -1, dtype=torch.int64, device=dev)
        self.last_step: Any = None  # the step whose greedy verification the buffers hold
        v = r.model.cfg.vocab_size  # sampled verification's inputs and result
        self.s_temp = torch.ones(n, dtype=torch.float32, device=dev)
        self.s_top_k = torch.full((n,), v, dtype=torch.int64, device=dev)
        self.s_top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self.s_greedy = torch.ones(n, dtype=torch.bool, device=dev)
        self.s_u = torch.zeros(n, q, dtype=torch.float64, device=dev)
        self.s_q = torch.zeros(n, self.K, v, dtype=torch.float32, device=dev)
        self.s_accepted = torch.zeros(n, dtype=torch.int64, device=dev)
        self.s_emitted = torch.full((n, q), -1, dtype=torch.int64, device=dev)

    def _alloc_draft(self, scratch_page: int) -> None:
        r, n, k = self.r, self.sizes[-1], max(self.K - 1, 1)
        dev, d = r.bm.table.device, r.draft
        width = -(-r.bm.table.shape[1] * r.bm.P // r.layout.page_size) + 1
        vd, v = d.cfg.draft_vocab_size, d.cfg.vocab_size
        self.draft_scratch_page = scratch_page
        self.tok0 = torch.zeros(n, dtype=torch.int64, device=dev)
        self.feat = torch.zeros(n, d.cfg.hidden_size, dtype=d.dtype, device=dev)
        self.ends = torch.ones(n, dtype=torch.int64, device=dev)
        self.dtab = torch.full((n, width), scratch_page, dtype=torch.int32, device=dev)
        self.temp = torch.ones(n, dtype=torch.float32, device=dev)
        self.greedy = torch.ones(n, dtype=torch.bool, device=dev)
        self.noise = torch.ones(k, n, vd, dtype=torch.float32, device=dev)
        self.out_toks = torch.zeros(n, k, dtype=torch.int64, device=dev)
        self.out_q = torch.zeros(n, k, v, dtype=torch.float32, device=dev)
        self.arange = torch.arange(n + 1, dtype=torch.int32, device=dev)
        q = self.K + 1  # the early graph's inputs: the verification, the verify rows' positions
        self.e_emit = torch.zeros(n, q, dtype=torch.int64, device=dev)
        self.e_acc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.e_pos = self.pad_pos.clone()
        self.trow = torch.arange(n, dtype=torch.int64, device=dev).repeat_interleave(q)
        self.early_toks = torch.zeros(n, self.K, dtype=torch.int64, device=dev)
        self.e_noise0 = torch.ones(n, vd, dtype=torch.float32, device=dev)  # a sampled first pick's Exp(1) noise
        self.e_q = torch.zeros(n, self.K, v, dtype=torch.float32, device=dev)  # sampled drafts' distributions

    # ---- capture -------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, in one memory pool."""
        dev = self.r.bm.table.device
        pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        for B in reversed(self.sizes):
            self._host = self._pad_host(0, B)
            self._verify[B] = _Graph(lambda B=B: self._verify_fn(B), dev, pool)
            for sampled in (False, True):
                self._early[(B, sampled)] = _Graph(lambda B=B, s=sampled: self._early_fn(B, s), dev, pool)
            for filt in (False, True):
                self._sampled[(B, filt)] = _Graph(lambda B=B, f=filt: self._sampled_fn(B, f), dev, pool)
            if self.K > 1:
                for sampled in (False, True):
                    self._chain[(B, sampled)] = _Graph(lambda B=B, s=sampled: self._chain_fn(B, s), dev, pool)

    def _pad_host(self, b: int, B: int, ends: list[int] | None = None) -> dict[str, list[int]]:
        """Host mirrors of B rows whose first b are real (verify lengths, chain ends) and the rest padding."""
        q, real = self.K + 1, (ends or [])[:b]
        return {"verify": real + [q] * (B - b), "chain": real + [1] * (B - b), "extend": [q] * B, "early": [1] * B}

    def _verify_fn(self, B: int) -> None:
        r, T, q = self.r, B * (self.K + 1), self.K + 1
        meta = AttnMetadata(self.qsl[:B + 1], self.lens[:B], self.tab[:B], self.slots[:T], self.pos[:T],
                            [q] * B, self._host["verify"])
        hidden = r.model(self.ids[:T], self.pos[:T], meta, r.kv, r.capture)
        self.logits[:T] = r.model.compute_logits(hidden)
        res = verify_greedy(self.logits[:T].view(B, q, -1), self.drafts[:B], self.num_draft[:B])
        self.accepted[:B] = res.num_accepted
        self.emitted[:B] = res.output_tokens

    def _sampled_fn(self, B: int, filter_rows: bool) -> None:
        q = self.K + 1
        p = target_distribution_rows(self.logits[:B * q].view(B, q, -1), self.s_temp[:B], self.s_top_k[:B],
                                     self.s_top_p[:B], filter_rows)
        res = verify_sampled(p, self.s_q[:B], self.drafts[:B], self.num_draft[:B], self.s_greedy[:B], self.s_u[:B])
        self.s_accepted[:B] = res.num_accepted
        self.s_emitted[:B] = res.output_tokens

    def _chain_fn(self, B: int, sampled: bool) -> None:
        d = self.r.draft

        def pick(logits: torch.Tensor, i: int) -> tuple[torch.Tensor, None]:
            if sampled:
                s = draw_from_noise(logits, self.temp[:B], self.greedy[:B], self.noise[i - 1, :B])
                tok = d.to_target_ids(s.token_ids)
                self.out_q[:B, i - 1] = d.probs_to_target(s.probs)
            else:
                tok = d.to_target_ids(logits.argmax(-1))
            self.out_toks[:B, i - 1] = tok
            return tok, None

        chain_steps(d, self.r.layout.store, self.tok0[:B], self.feat[:B], self.dtab[:B], self.ends[:B],
                    self._host["chain"], self.K, pick, self.arange)

    def _early_fn(self, B: int, sampled: bool) -> None:
        r, d, T = self.r, self.r.draft, B * (self.K + 1)

        def pick(logits: torch.Tensor, i: int) -> tuple[torch.Tensor, None]:
            if sampled:  # step i's noise: the first pick's own buffer, then the chain's
                noise = self.e_noise0[:B] if i == 0 else self.noise[i - 1, :B]
                s = draw_from_noise(logits, self.temp[:B], self.greedy[:B], noise)
                tok = d.to_target_ids(s.token_ids)
                self.e_q[:B, i] = d.probs_to_target(s.probs)
            else:
                tok = d.to_target_ids(logits.argmax(-1))
            self.early_toks[:B, i] = tok
            return tok, None

        draft_verified(d, r.layout.store, r.capture.buffer[:T], self.e_emit[:B], self.e_pos[:T], self.e_acc[:B],
                       self.dtab[:B], self.trow[:T], self.qsl[:B + 1], self._host["extend"], self._host["early"],
                       self.K, pick, self.arange)

    # ---- verify replay -------------------------------------------------------------------------
    def fits_verify(self, step: Any) -> bool:
        """A pure-decode step: every row verifies K drafts (no prefill, plain or scoring rows)."""
        n = len(step.rows)
        return (0 < n <= self.sizes[-1] and len(step.verify) == n and not step.plain
                and step.score_targets.numel() == 0 and all(row.length == self.K + 1 for row in step.rows))

    def run_verify(self, step: Any) -> torch.Tensor:
        """Logits [B (1 + K), V] of the step (rows in order), the features in the runner's capture buffer."""
        B, q = len(step.rows), self.K + 1
        Bp, T = next(s for s in self.sizes if s >= B), B * q
        self.ids[:T].copy_(step.input_ids)
        self.pos[:T].copy_(step.positions)
        self.slots[:T].copy_(step.meta.slot_mapping)
        self.lens[:B].copy_(step.meta.seq_lens)
        w = step.meta.block_tables.shape[1]
        self.tab[:B, :w].copy_(step.meta.block_tables)
        self.drafts[:B].copy_(step.draft_tokens)
        if Bp > B:  # padding rows of an earlier, larger step must not write into live pages
            self._pad_verify(B, Bp)
        self._host = self._pad_host(B, Bp, list(step.meta.seq_lens_host))
        self._verify[Bp].replay()
        self.replays["verify"] += 1
        self.last_step = step
        return self.logits[:T]

    def greedy_result(self, step: Any) -> VerifyResult | None:
        """verify_greedy of `step`, computed inside its verify graph (None if the step ran eagerly)."""
        if step is not self.last_step:
            return None
        B = len(step.rows)
        return VerifyResult(num_accepted=self.accepted[:B].clone(), output_tokens=self.emitted[:B].clone())

    def sampled_result(self, step: Any, params: list, draft_probs: list[torch.Tensor],
                       uniforms: torch.Tensor) -> VerifyResult | None:
        """verify_sampled of `step` on its verify graph's logits, in the sampled verification graph (None if
        the step's target ran eagerly); params per row, draft_probs [K, V] per row, uniforms [B, K + 1]."""
        if step is not self.last_step:
            return None
        B = len(step.rows)
        Bp = next(s for s in self.sizes if s >= B)
        for buf, values in zip((self.s_temp, self.s_top_k, self.s_top_p), sampling_rows(params, self.s_q.shape[2])):
            buf[:B].copy_(upload_list(values, buf.dtype, buf.device))
        self.s_greedy[:B].copy_(upload_list([p.greedy for p in params], torch.bool, self.s_greedy.device))
        torch.stack(draft_probs, out=self.s_q[:B])
        self.s_u[:B].copy_(uniforms)
        self._sampled[(Bp, filtered(params))].replay()
        self.replays["sampled"] += 1
        return VerifyResult(num_accepted=self.s_accepted[:B].clone(), output_tokens=self.s_emitted[:B].clone())

    def _pad_verify(self, B: int, Bp: int) -> None:
        q = self.K + 1
        lo, hi = B * q, Bp * q
        self.ids[lo:hi].zero_()
        self.pos[lo:hi].copy_(self.pad_pos[lo:hi])
        self.slots[lo:hi].copy_(self.pad_slots[lo:hi])
        self.lens[B:Bp].fill_(q)
        self.tab[B:Bp].fill_(self.scratch_page)
        self.drafts[B:Bp].zero_()

    # ---- chain replay --------------------------------------------------------------------------
    def fits_chain(self, b: int) -> bool:
        return self.K > 1 and 0 < b <= self.sizes[-1]

    def run_chain(self, tok: torch.Tensor, feature: torch.Tensor, tables: torch.Tensor, ends: torch.Tensor,
                  ends_host: list[int], sampling: "ChainSampling | None"
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [b, K - 1] (target ids) of chain steps 1..K-1, and their distributions [b, K-1, V]
        for a sampled batch; tok [b] is the first draft token, feature [b, H] the feature after it."""
        b = tok.shape[0]
        Bp = next(s for s in self.sizes if s >= b)
        self.tok0[:b].copy_(tok)
        self.feat[:b].copy_(feature)
        self.ends[:b].copy_(ends)
        self.dtab[:b, :tables.shape[1]].copy_(tables)
        if Bp > b:
            self._pad_chain(b, Bp)
        if sampling is not None:
            sampling.fill(self, b)
        self._host = self._pad_host(b, Bp, ends_host)
        self._chain[(Bp, sampling is not None)].replay()
        self.replays["chain"] += 1
        return self.out_toks[:b], None if sampling is None else self.out_q[:b]

    def _pad_chain(self, b: int, Bp: int) -> None:
        self.tok0[b:Bp].zero_()
        self.feat[b:Bp].zero_()
        self.ends[b:Bp].fill_(1)
        self.dtab[b:Bp].fill_(self.draft_scratch_page)
        self.temp[b:Bp].fill_(1.0)
        self.greedy[b:Bp].fill_(True)
        self.noise[:, b:Bp].fill_(1.0)


    # ---- early replay --------------------------------------------------------------------------
    def fits_early(self, b: int) -> bool:
        return 0 < b <= self.sizes[-1]

    def run_early(self, res: VerifyResult, positions: torch.Tensor, tables: torch.Tensor, lens_host: list[int],
                  ends_host: list[int], sampling: "ChainSampling | None" = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [b, K] (target ids) of b pure-verify rows from their verification `res`, the rows'
        positions [b (K + 1)] and draft tables, and their distributions [b, K, V] when `sampling` (else None);
        lens_host / ends_host: the extend's and the chain's host mirrors (exact for a backend that reads them;
        the captured graphs keep capture time's)."""
        b, q = res.num_accepted.shape[0], self.K + 1
        Bp = next(s for s in self.sizes if s >= b)
        self.e_emit[:b].copy_(res.output_tokens)
        self.e_acc[:b].copy_(res.num_accepted)
        self.e_pos[:b * q].copy_(positions)
        self.dtab[:b, :tables.shape[1]].copy_(tables)
        if Bp > b:
            self._pad_early(b, Bp)
        if sampling is not None:
            sampling.fill_first(self, b)
            sampling.fill(self, b)
        self._host = {**self._pad_host(0, Bp), "extend": lens_host + [q] * (Bp - b),
                      "early": ends_host + [1] * (Bp - b)}
        self._early[(Bp, sampling is not None)].replay()
        self.replays["early"] += 1
        self.last_early = (Bp, sampling is not None)
        toks = self.early_toks[:b].clone()  # (the next replay overwrites the buffers; states keep theirs)
        return toks, None if sampling is None else self.e_q[:b].clone()

    def replay_last_early(self) -> None:
        """The last early replay again, on the buffers as it left them (benchmarks: the draft alone)."""
        self._early[self.last_early].replay()

    def _pad_early(self, b: int, Bp: int) -> None:
        q = self.K + 1
        self.e_emit[b:Bp].zero_()
        self.e_acc[b:Bp].zero_()
        self.e_pos[b * q:Bp * q].copy_(self.pad_pos[b * q:Bp * q])
        self.dtab[b:Bp].fill_(self.draft_scratch_page)
        self.temp[b:Bp].fill_(1.0)
        self.greedy[b:Bp].fill_(True)


class ChainSampling:
    """A sampled chain's per-row temperature and generators; `fill` draws the noise of steps 1..K-1."""

    def __init__(self, temperatures: list[float], generators: list, fallback: torch.Generator) -> None:
        self.temperatures, self.generators, self.fallback = temperatures, generators, fallback

    def fill_first(self, g: SpecGraphs, b: int) -> None:
        """The early graph's first pick: one noise row per request, in the eager first pick's order."""
        for row, gen in enumerate(self.generators):
            g.e_noise0[row].exponential_(generator=gen if gen is not None else self.fallback)

    def fill(self, g: SpecGraphs, b: int) -> None:
        t = self.temperatures
        g.temp[:b].copy_(torch.tensor([x if x > 0 else 1.0 for x in t]))
        g.greedy[:b].copy_(torch.tensor([x <= 0 for x in t]))
        for i in range(g.K - 1):  # step-major, row by row: the eager chain's order of draws
            for row, gen in enumerate(self.generators):
                g.noise[i, row].exponential_(generator=gen if gen is not None else self.fallback)
