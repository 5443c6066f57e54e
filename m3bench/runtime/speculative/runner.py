"""One-model Eagle3 as the propose/verify strategy of the engine's step loop (Engine(..., spec=runner)):
the target step with verify rows, verification, drafting.

    spec = SpecRunner(model, kv, bm, draft, layout, SpecConfig(...), capture, generator)
    step = spec.prepare(batch)                 # verify rows run [last token, d_1..d_K]; others as scheduled
    logits = spec.run(step, batch)             # captures the residuals at the capture layers (no sync)
    res = spec.verify(logits[:nv * (K + 1)], step)
    ... the engine lands res's tokens (Engine.land) and rolls lengths back ...
    spec.propose(spec.extends(step))           # draft: extend over the newly verified tokens, chain K - 1 more

With `drafts_on_device` (overlap) the chain's drafts are not read back: the next `prepare` takes them on
the device, so the host schedules and builds the next step while the draft runs. A pure verify step
drafts even earlier (`draft_early`, before the host lands it): the draft's inputs are the verification on
the device, and the host lands the step while the draft runs.

Position contract (tests/runtime/speculative/test_spec_loop.py): the target's KV holds positions [0, L)
and token L is known but not cached. A verify row runs tokens [t_L, d_1..d_K] at positions
[L, L + K]; a accepted -> L' = L + a + 1 (rejected positions stay in the cache as stale values past
the length, overwritten later: rollback by lengths, never by copies). The draft's position p pairs
token p + 1 with the target's feature at p: its extend runs tokens [L + 1, L'] at positions [L, L'),
then chain step i = 1..K-1 feeds d_i at position L' - 1 + i.

With `graphs` set (speculative/graphs.py, LLM(cuda_graphs=True)), pure-decode target steps replay the
captured verify forward (and its greedy verification), and the chain replays the captured K - 1 steps;
everything else, and everything on the eager path, runs as above.

Tensor parallelism: the device work is runtime/rank_step.target_logits and speculative/draft_step.run_draft,
which every rank runs on the inputs this runner builds and hands to `link` (rank 0's Driver) first;
verification and the draft picks are rank 0's (the picks reach the other ranks through the link).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.decode_state import PLACEHOLDER, DecodeState
from m3bench.runtime.kv_cache import KVCache
from m3bench.runtime.model import CaptureSpec
from m3bench.runtime.overlap import VerifiedOnHost
from m3bench.runtime.rank_step import NO_LINK, target_logits
from m3bench.runtime.scheduler import ScheduledBatch
from m3bench.runtime.sequence import Sequence
from m3bench.runtime.speculative.config import SpecConfig
from m3bench.runtime.speculative.draft import Eagle3Draft
from m3bench.runtime.speculative.draft_step import DraftInputs, draft_verified, run_draft
from m3bench.runtime.speculative.propose import sample_draft
from m3bench.runtime.speculative.stats import AcceptanceRecord
from m3bench.runtime.speculative.synthetic import SyntheticAcceptance, force_acceptance
from m3bench.runtime.speculative.verify import (
    VerifyResult,
    draw_uniforms,
    emitted_logprobs,
    target_distribution,
    verify_greedy,
    verify_sampled,
)
from m3bench.runtime.step_rows import Row, StepInputs, StepRows
from m3bench.runtime.step_timing import NO_CLOCK
from m3bench.runtime.transfer import upload_list


@dataclass
class DraftState:
    drafts: list[int]  # target-vocabulary ids the next verify checks (empty: decode without drafts);
    #                    PLACEHOLDERs while they are still on the device (drafts_on_device)
    q: torch.Tensor | None = None  # [K, V] the distributions they were drawn from (sampled requests)
    tokens: torch.Tensor | None = None  # [K] the drafts on the device (drafts_on_device), else None


@dataclass(frozen=True)
class Extend:
    """Draft work for one request after the step: positions [start, end), then K chained drafts if propose."""

    seq: Sequence
    start: int
    end: int
    feature_rows: list[int]  # rows of the capture buffer holding the target's features at start..end-1
    propose: bool


def eligible(seq: Sequence) -> bool:
    """Requests still under min_tokens (stop tokens banned) decode one token at a time."""
    return len(seq.output_ids) >= seq.params.min_tokens


class SpecRunner:
    clock: Any = NO_CLOCK  # engine_builder sets the engine's StepClock (runtime/step_timing.py)
    link: Any = NO_LINK  # tensor parallelism: rank 0's Driver, which sends each step to the other ranks

    def __init__(self, model: Any, kv: KVCache, bm: BlockManager, draft: Eagle3Draft, layout: Any,
                 spec: SpecConfig, capture: CaptureSpec, generator: torch.Generator) -> None:
        self.model, self.kv, self.bm, self.draft, self.layout = model, kv, bm, draft, layout
        self.K, self.spec, self.device = spec.draft_len, spec, model.device
        self.capture = capture  # the target's residuals at the draft's capture layers (setup.spec_capture)
        self.generator = generator  # the sampler's, for unseeded requests
        al = spec.synthetic_acceptance_length
        self.synth = None if al is None else SyntheticAcceptance(al, spec.seed, model.device)
        self.states: dict[int, DraftState] = {}
        self.records: dict[int, AcceptanceRecord] = {}
        self.graphs = None  # SpecGraphs (speculative/graphs.py): captured verify and chain steps, or eager
        self.drafts_on_device = False  # overlap: the drafts stay on the device, no sync after the chain
        self.early = True  # with drafts_on_device: pure verify steps draft before landing (draft_early)
        self.early_steps = 0  # steps drafted that way (tests, benchmarks)
        self.dstate = DecodeState(bm, model.device, self.K)  # early-drafted rows: the next verify on the device
        self.device_steps = 0  # verify steps built that way (tests, benchmarks)
        q, n = self.K + 1, bm.max_rows
        self._qsl = (torch.arange(n + 1, dtype=torch.int64, device=model.device) * q).int()
        self._idx = torch.arange(n * q, dtype=torch.int64, device=model.device)
        self._held = (PLACEHOLDER,) * self.K

    def release(self, seq: Sequence) -> None:
        """The target freed the request's pages (finish, abort, preemption): its draft state goes too."""
        self.states.pop(seq.request_id, None)
        self.layout.release(seq)

    def record(self, seq: Sequence) -> AcceptanceRecord:
        return self.records.setdefault(seq.request_id, AcceptanceRecord())

    # ---- target step ---------------------------------------------------------------------------
    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        if self.dstate.ready(batch):  # rows 0..B-1, each early-drafted by the last step that ran it
            return self._prepare_verify(batch)
        self.dstate.forget_rows(batch.seqs)  # (their state moves on with this host-built step)
        rows = StepRows()
        for seq, n in zip(batch.seqs, batch.num_tokens):
            st = self.states.get(seq.request_id)
            rows.add(seq, n, st.drafts if st is not None and seq.num_to_compute == 1 else ())
        fill = self._device_drafts if self.drafts_on_device else None  # the drafts the last chain left there
        return rows.to_device(batch, self.bm, self.device, self.K, draft_tokens=fill)

    def _prepare_verify(self, batch: ScheduledBatch) -> StepInputs:
        """A pure-verify step from the DecodeState: every row [last token, its K drafts], no per-token host work."""
        B, q = len(batch.seqs), self.K + 1
        self.bm.flush()
        ids, pos, slots, lens, drafts = self.dstate.verify_inputs(B)
        lens_host = [s.num_computed + q for s in batch.seqs]
        tables = self.bm.table[:B, :-(-max(lens_host) // self.bm.P)]
        meta = AttnMetadata(self._qsl[:B + 1], lens, tables, slots, pos, [q] * B, lens_host)
        rows = [Row(s, s.num_computed, q, i * q, self._held) for i, s in enumerate(batch.seqs)]
        self.device_steps += 1
        return StepInputs(ids, pos, meta, self._idx[:B * q], [], self._idx[:0], [], device_built=True, rows=rows,
                          verify=rows, draft_tokens=drafts)

    def _device_drafts(self, verify: list[Row]) -> torch.Tensor:
        return torch.stack([self.states[r.seq.request_id].tokens for r in verify])

    def run(self, step: StepInputs, batch: ScheduledBatch) -> torch.Tensor:
        return self.run_target(step)

    @torch.inference_mode()
    def run_target(self, step: StepInputs) -> torch.Tensor:
        """Logits [N, V] float32 of step.logits_idx; the capture-layer residuals land in the buffer."""
        with self.clock.forward():
            if self.graphs is not None and self.graphs.fits_verify(step):
                return self.graphs.run_verify(step)
            with self.link.forward(step, captured=True):
                return target_logits(self.model, self.kv, step, self.capture)

    # ---- verification --------------------------------------------------------------------------
    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, step: StepInputs) -> VerifyResult:
        """Accepted counts and emitted tokens of the verify rows ([nv * (K + 1), V] logits)."""
        seqs = [r.seq for r in step.verify]
        target = logits.view(len(seqs), self.K + 1, -1)
        num_draft = torch.full((len(seqs),), self.K, dtype=torch.int64, device=self.device)
        if self.synth is not None:
            return force_acceptance(step.draft_tokens, self._target_picks(target, seqs), self.synth.draw(num_draft))
        if all(s.params.greedy for s in seqs):
            captured = self.graphs.greedy_result(step) if self.graphs is not None else None
            return captured if captured is not None else verify_greedy(target, step.draft_tokens, num_draft)
        params, vocab = [s.params for s in seqs], target.shape[-1]
        qs = [self._draft_probs(r, d, vocab) for r, d in zip(step.verify, step.draft_tokens)]
        u = draw_uniforms([self.K] * len(seqs), self.K, [s.generator for s in seqs], self.generator, self.device)
        captured = self.graphs.sampled_result(step, params, qs, u) if self.graphs is not None else None
        if captured is not None:
            return captured
        greedy = torch.tensor([s.params.greedy for s in seqs], device=self.device)
        return verify_sampled(target_distribution(target, params), torch.stack(qs), step.draft_tokens, num_draft,
                              greedy, u)

    def _draft_probs(self, row: Row, drafts: torch.Tensor, vocab: int) -> torch.Tensor:
        q = self.states[row.seq.request_id].q
        if q is not None:
            return q
        return torch.nn.functional.one_hot(drafts, vocab).float()  # greedy drafts: one-hot (unused by greedy rows)

    def _target_picks(self, target: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """[B, K+1] the target's own token at each position: argmax, or a draw for sampled requests."""
        picks = target.argmax(-1)
        if all(s.params.greedy for s in seqs):
            return picks
        p = target_distribution(target, [s.params for s in seqs]).flatten(0, 1)
        drawn = torch.multinomial(p, 1, generator=self.generator).view(picks.shape)
        greedy = torch.tensor([s.params.greedy for s in seqs], device=self.device)[:, None]
        return torch.where(greedy, picks, drawn)

    def verify_logprobs(self, logits: torch.Tensor, step: StepInputs, res: VerifyResult) -> tuple:
        return emitted_logprobs(logits, [r.seq.params for r in step.verify], res)

    # ---- drafting ------------------------------------------------------------------------------
    def extends(self, step: StepInputs) -> list[Extend]:
        """The draft's work once the step landed: every unfinished generating request extends over its
        newly verified positions; those that sampled (verify and plain rows) propose K drafts too."""
        sampled = {id(r) for r in step.plain}
        out = []
        for row in step.rows:
            seq = row.seq
            if seq.is_score or seq.finished:
                continue
            propose = (bool(row.drafts) or id(row) in sampled) and eligible(seq)
            feature_rows = list(range(row.base, row.base + seq.num_computed - row.start))
            out.append(Extend(seq, row.start, seq.num_computed, feature_rows, propose))
        return out

    @torch.inference_mode()
    def propose(self, extends: list[Extend]) -> None:
        """Extend the draft's KV over the newly verified positions; chain K drafts for proposing rows."""
        with self.clock.forward():
            self._propose(extends)

    def _propose(self, extends: list[Extend]) -> None:
        for e in extends:
            self.states[e.seq.request_id] = DraftState([])
            self.layout.reserve(e.seq, e.end + (self.K - 1 if e.propose else 0))
        if not extends:
            return
        d, proposing = self._draft_inputs(extends)
        seqs = [e.seq for e in proposing]
        with self.link.draft(d):
            toks, q = run_draft(self.draft, self.layout.store, self.capture.buffer, d, self.K,
                                lambda logits: self._share(self._pick(logits, seqs)), self._chain_graph(seqs, d))
        if seqs:
            self._store_drafts(seqs, toks, q)

    # ---- drafting before landing (overlap) ------------------------------------------------------
    @torch.inference_mode()
    def draft_early(self, step: StepInputs, res: VerifyResult | None) -> VerifiedOnHost | None:
        """Launch the draft of a pure verify step straight after its verification, from `res` on the
        device; the verification's host copy (queued first: reading it does not wait for the draft), or None
        when the step drafts after landing (`propose`)."""
        if res is None or not self._early_fits(step):
            return None
        host = VerifiedOnHost(res)
        seqs = [r.seq for r in step.verify]
        with self.clock.forward():
            toks, q = self._draft_verified(step, res, seqs, host)
        for seq in seqs:
            self.states[seq.request_id] = DraftState([])
        self._store_drafts(seqs, toks, q)
        q = self.K + 1  # each row's next verify: the bonus token at L' = L + a + 1, then these drafts
        start = step.positions[:len(seqs) * q].view(-1, q)[:, 0] + res.num_accepted + 1
        self.dstate.record_verified(seqs, start, res.output_tokens.gather(1, res.num_accepted[:, None])[:, 0], toks)
        self.early_steps += 1
        return host

    def _early_fits(self, step: StepInputs) -> bool:
        """Overlap at TP 1, every row verifies K drafts (no prefill, plain or scoring rows)."""
        n = len(step.rows)
        return (self.early and self.drafts_on_device and not self.link.tensor_parallel and n > 0
                and len(step.verify) == n and not step.plain and step.score_targets.numel() == 0
                and all(r.length == self.K + 1 and r.base == i * r.length for i, r in enumerate(step.rows)))

    def _draft_verified(self, step: StepInputs, res: VerifyResult, seqs: list[Sequence],
                        host: VerifiedOnHost) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [B, K] (and, for a sampled batch, their distributions [B, K, V]) from the verification:
        the extend over each verify row's K + 1 positions, the chain from the last accepted one
        (draft_step.draft_verified; its graph where it fits)."""
        q, starts = self.K + 1, [r.start for r in step.verify]
        for seq, start in zip(seqs, starts):  # the farthest a chain can reach: L + K + (K - 1)
            self.layout.reserve(seq, start + 2 * self.K)
        tables = self.layout.tables(seqs, max(starts) + 2 * self.K)
        lens_host = [s + q for s in starts]
        reads_host = not getattr(self.draft.layer.self_attn.backend, "graph_safe", False)
        accepted = host.lists()[0] if reads_host else [self.K] * len(seqs)  # (exact only where it is read)
        ends_host = [s + a + 1 for s, a in zip(starts, accepted)]
        B, T = len(seqs), len(seqs) * q
        if self.graphs is not None and self.graphs.fits_early(B):
            return self.graphs.run_early(res, step.positions[:T], tables, lens_host, ends_host,
                                         self._chain_sampling(seqs))
        d, rows = self.draft, torch.arange(B + 1, dtype=torch.int32, device=self.device)
        qs: list = []

        def pick(logits: torch.Tensor, i: int) -> tuple:
            tok, q_i = self._pick(logits, seqs)
            qs.append(q_i)
            return tok, q_i

        toks = draft_verified(d, self.layout.store, self.capture.buffer[:T], res.output_tokens, step.positions[:T],
                              res.num_accepted, tables, rows[:B].long().repeat_interleave(q), self._qsl[:B + 1],
                              lens_host, ends_host, self.K, pick, rows)
        return torch.stack(toks, dim=1), None if qs[0] is None else torch.stack(qs, dim=1)

    def _draft_inputs(self, extends: list[Extend]) -> tuple[DraftInputs, list[Extend]]:
        """The draft phase's inputs on the device (one host -> device copy), and the proposing requests."""
        h = _HostDraft(extends)
        max_len = max(e.end + (self.K - 1 if e.propose else 0) for e in extends)
        tables = self.layout.tables([e.seq for e in extends], max_len)
        flat = upload_list(h.flat(), torch.int64, self.device)
        ends_host = [e.end for e in h.proposing]
        return DraftInputs.from_flat(flat, h.sizes(), tables, h.q_lens, h.lens, ends_host), h.proposing

    def _share(self, picked: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A chain step's draft tokens go to the other tensor-parallel ranks (their next input)."""
        return self.link.picks(picked[0]), picked[1]

    def _chain_graph(self, seqs: list[Sequence], d: DraftInputs):
        """The captured chain steps for this phase's proposing rows, or None (eager)."""
        if self.graphs is None or not self.graphs.fits_chain(len(seqs)):
            return None
        sampling = self._chain_sampling(seqs)
        return lambda tok, feature, tables, ends: self.graphs.run_chain(tok, feature, tables, ends, d.ends_host,
                                                                        sampling)

    def _store_drafts(self, seqs: list[Sequence], toks: torch.Tensor, probs: torch.Tensor | None) -> None:
        if self.drafts_on_device:  # no sync: the next step schedules and builds while the chain runs
            held = [PLACEHOLDER] * self.K
            for i, seq in enumerate(seqs):
                self.states[seq.request_id] = DraftState(held, None if probs is None else probs[i], toks[i])
            return
        drafts = toks.tolist()  # the draft phase's one device -> host sync
        for i, seq in enumerate(seqs):
            self.states[seq.request_id] = DraftState(drafts[i], None if probs is None else probs[i])

    def _chain_sampling(self, seqs: list[Sequence]):
        """None for an all-greedy chain; else the temperatures and generators the chain graph draws with."""
        if all(s.params.greedy for s in seqs):
            return None
        from m3bench.runtime.speculative.graphs import ChainSampling

        return ChainSampling([s.params.temperature for s in seqs], [s.generator for s in seqs], self.generator)

    def _pick(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Next draft token per row (target ids) and, for sampled batches, the distribution it came from."""
        if all(s.params.greedy for s in seqs):
            return self.draft.to_target_ids(logits.argmax(-1)), None
        s = sample_draft(logits, [x.params.temperature for x in seqs], [x.generator for x in seqs], self.generator)
        return self.draft.to_target_ids(s.token_ids), self.draft.probs_to_target(s.probs)


class _HostDraft:
    """Host lists of the draft's extend step (all rows) and of the chain (proposing rows)."""

    def __init__(self, extends: list[Extend]) -> None:
        self.tok, self.pos, self.trow, self.feat = [], [], [], []
        self.qsl, self.lens, self.q_lens = [0], [], []
        self.last, self.ends, self.prow = [], [], []
        self.proposing: list[Extend] = []
        for i, e in enumerate(extends):
            n = e.end - e.start
            self.tok += e.seq.token_slice(e.start + 1, e.end + 1)
            self.pos += range(e.start, e.end)
            self.trow += [i] * n
            self.feat += e.feature_rows
            self.qsl.append(len(self.tok))
            self.lens.append(e.end)
            self.q_lens.append(n)
            if e.propose:
                self.last.append(len(self.tok) - 1)
                self.ends.append(e.end)
                self.prow.append(i)
                self.proposing.append(e)

    def flat(self) -> list[int]:
        return (self.tok + self.pos + self.trow + self.feat + self.qsl + self.lens + self.last + self.ends
                + self.prow)

    def sizes(self) -> list[int]:
        t, b, p = len(self.tok), len(self.lens), len(self.last)
        return [t, t, t, t, b + 1, b, p, p, p]
