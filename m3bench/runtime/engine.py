"""The serving engine: one step is schedule -> build inputs -> run the model -> sample -> postprocess.

    engine = Engine(runner, scheduler, sampler, tokenizer, eos_ids, max_model_len, spec=None, overlap=False)
    engine.add(seq)
    while engine.has_work():
        deltas = engine.step()          # list[RequestDelta]: new tokens / text / timestamps per request

Inputs are built on the host as rows (runtime/step_rows.py, shared with speculation) and copied to the
device once; the slot of every token is looked up on the device from the persistent block table. A step
in which every request decodes one token from its own row is built on the device instead, from the
tokens and positions the previous steps left there (runtime/decode_state: no per-request host work).

Modes of the one loop: `spec` (a SpecRunner) makes it speculative (propose / verify as a strategy);
`overlap` lands a plain step's tokens one step late while the next step runs (runtime/overlap.py). Under
tensor parallelism the runners hand each step's inputs to their `link` first (runtime/rank_step.py).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.decode_state import PLACEHOLDER, DecodeState
from m3bench.runtime.kv_cache import KVCache
from m3bench.runtime.overlap import (
    Flight,
    VerifiedOnHost,
    num_placeholders,
    pending,
    strip_placeholders,
    to_host,
)
from m3bench.runtime.rank_step import NO_LINK, target_logits
from m3bench.runtime.sampler import Sampler, SamplerOutput, make_generator
from m3bench.runtime.scheduler import ScheduledBatch, Scheduler
from m3bench.runtime.sequence import Detokenizer, FinishReason, Sequence
from m3bench.runtime.step_rows import Row, StepInputs, StepRows
from m3bench.runtime.step_timing import NO_CLOCK


@dataclass(frozen=True)
class RequestDelta:
    """What one request gained in one step."""

    request_id: int
    token_ids: tuple[int, ...]  # new this step
    text: str  # new this step
    token_times_s: tuple[float, ...]  # host time.time() at which each new token was known
    finished: bool
    finish_reason: str | None  # "stop" / "length" / "abort" once finished
    logprobs: tuple[float, ...] = ()  # per new token, when the request asked for logprobs
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per new token: (id, logprob), best first
    prompt_logprobs: tuple[float, ...] = ()  # with SamplingParams.prompt_logprobs: prompt tokens 1.. (once)
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # their top n (id, logprob)


class ModelRunner:
    """Turns a ScheduledBatch into device tensors and runs the model on them."""

    clock: Any = NO_CLOCK  # engine_builder sets the engine's StepClock (runtime/step_timing.py)
    link: Any = NO_LINK  # tensor parallelism: rank 0's Driver, which sends each step to the other ranks

    def __init__(self, model: Any, kv: KVCache, bm: BlockManager, device: torch.device,
                 graphs: "DecodeGraphs | None" = None) -> None:
        self.model, self.kv, self.bm, self.device = model, kv, bm, device
        self.P = bm.P
        self.graphs = graphs
        self.state: DecodeState | None = DecodeState(bm, device)  # None: every step built on the host
        self._idx = torch.arange(bm.max_rows + 1, dtype=torch.int64, device=device)
        self._qsl = self._idx.int()
        self._none = self._idx[:0]

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        if self.state is not None and self.state.ready(batch):
            return self._prepare_decode(batch)
        rows = StepRows()
        for seq, n in zip(batch.seqs, batch.num_tokens):
            rows.add(seq, n)
        return rows.to_device(batch, self.bm, self.device, row_tokens=None if self.state is None else self.state.tokens)

    def _prepare_decode(self, batch: ScheduledBatch) -> StepInputs:
        """Inputs of a decode step from the DecodeState: no per-request work on the host."""
        B = len(batch.seqs)
        self.bm.flush()
        ids, pos, slots, lens, lens_host = self.state.inputs(B)
        width = -(-max(lens_host) // self.P)
        meta = AttnMetadata(query_start_loc=self._qsl[:B + 1], seq_lens=lens, block_tables=self.bm.table[:B, :width],
                            slot_mapping=slots, positions=pos, query_lens_host=[1] * B, seq_lens_host=lens_host)
        return StepInputs(ids, pos, meta, self._idx[:B], batch.seqs, self._none, [], device_built=True)

    def record(self, inputs: StepInputs, sampled: torch.Tensor) -> None:
        """Keep the step's sampled tokens on the device as the next decode inputs of their rows."""
        if self.state is None:
            return
        if inputs.device_built:
            self.state.advance(len(inputs.sample_seqs), sampled)
        else:
            self.state.record(inputs.sample_seqs, inputs.sample_rows, inputs.sample_pos, inputs.sample_pos_host,
                              sampled)

    def _graph_fits(self, inputs: StepInputs, batch: ScheduledBatch) -> bool:
        if inputs.device_built:
            return len(batch.seqs) <= self.graphs.sizes[-1]
        return self.graphs.fits(batch)

    @torch.inference_mode()
    def run(self, inputs: StepInputs, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [N, V] float32 of the rows in inputs.logits_idx."""
        with self.clock.forward():
            if self.graphs is not None and self._graph_fits(inputs, batch):
                return self.model.compute_logits(self.graphs.replay(inputs)[inputs.logits_idx])
            with self.link.forward(inputs, captured=False):
                return target_logits(self.model, self.kv, inputs)


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """Captured decode sizes: 1, 2, 4, 8, then steps of 8 (a batch runs in the smallest that holds it)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch_size] + list(range(8, max_batch_size + 8, 8))
    return sorted({min(b, max_batch_size) for b in sizes})


class DecodeGraphs:
    """CUDA graphs of the model's decode step (one token per request, rows 0..B-1 of the block table).

    Static buffers hold the step's inputs; the graph of size Bp >= B replays with rows B..Bp-1 padded:
    token 0 at position 0, length 1, written to a scratch page no request owns. The attention backend
    must be graph-safe (launch sizes from static bounds, no host reads: the host mirrors are stale).
    """

    def __init__(self, model: Any, kv: KVCache, bm: BlockManager, scratch_page: int, max_batch_size: int) -> None:
        self.model, self.kv, self.bm = model, kv, bm
        self.sizes = graph_batch_sizes(max_batch_size)
        n, dev = self.sizes[-1], bm.table.device
        self.scratch_slot = scratch_page * bm.P
        self.ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slots = torch.full((n,), self.scratch_slot, dtype=torch.int64, device=dev)
        self.lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.qsl = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.out = torch.zeros(n, model.cfg.hidden_size, dtype=model.dtype, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def fits(self, batch: ScheduledBatch) -> bool:
        B = len(batch.seqs)
        return (B <= self.sizes[-1] and all(n == 1 for n in batch.num_tokens)
                and not any(s.is_score for s in batch.seqs) and [s.row for s in batch.seqs] == list(range(B)))

    def _meta(self, B: int) -> AttnMetadata:
        return AttnMetadata(query_start_loc=self.qsl[:B + 1], seq_lens=self.lens[:B], block_tables=self.bm.table[:B],
                            slot_mapping=self.slots[:B], positions=self.pos[:B], query_lens_host=[1] * B,
                            seq_lens_host=[1] * B)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, in one memory pool (warm-up runs write only the scratch page)."""
        pool = torch.cuda.graph_pool_handle()
        for B in reversed(self.sizes):
            meta = self._meta(B)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.model(self.ids[:B], self.pos[:B], meta, self.kv)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.out[:B] = self.model(self.ids[:B], self.pos[:B], meta, self.kv)
            self.graphs[B] = g

    def replay(self, inputs: StepInputs) -> torch.Tensor:
        B = inputs.input_ids.shape[0]
        Bp = next(b for b in self.sizes if b >= B)
        self.ids[:B].copy_(inputs.input_ids)
        self.pos[:B].copy_(inputs.positions)
        self.slots[:B].copy_(inputs.meta.slot_mapping)
        self.lens[:B].copy_(inputs.meta.seq_lens)
        if Bp > B:  # padding rows of an earlier, larger batch must not write into live pages
            self.ids[B:Bp].zero_(), self.pos[B:Bp].zero_(), self.lens[B:Bp].fill_(1)
            self.slots[B:Bp].fill_(self.scratch_slot)
        self.graphs[Bp].replay()
        return self.out[:B]


@dataclass(frozen=True)
class StepOutcome:
    """A launched step's results on the device: the sampled rows' tokens, the verify rows' verification."""

    inputs: StepInputs
    sampled: SamplerOutput | None  # the plain rows' (inputs.sample_seqs), or None
    verified: Any  # VerifyResult of inputs.verify (speculative/verify.py), or None
    verify_logprobs: tuple  # (chosen, tops) per verify row and position; (None, None) when no row asks


class Engine:
    """The step loop. `spec` (a SpecRunner, or None) is the propose/verify strategy: it builds the step's
    rows with the drafts to verify, verifies them, and drafts again over the positions that landed.
    `overlap` (runtime/overlap.py): a plain step's tokens land one step late, while the next step runs;
    under speculation the drafts stay on the device while the next step is scheduled and built."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, sampler: Sampler, tokenizer: Any,
                 eos_token_ids: tuple[int, ...], max_model_len: int, spec: Any = None, overlap: bool = False) -> None:
        self.runner, self.scheduler, self.sampler = runner, scheduler, sampler
        self.tokenizer, self.eos = tokenizer, frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.spec = spec
        self.stepper = runner if spec is None else spec  # prepare / run of the step
        self.overlap = overlap
        self.lands_late = overlap and spec is None  # plain overlap: tokens land one step late
        if spec is not None:
            spec.drafts_on_device = overlap
        self.flight: Flight | None = None  # (late) the launched step whose tokens have not landed

    def add(self, seq: Sequence) -> None:
        if seq.params.seed is not None:
            seq.generator = make_generator(seq.params.seed, self.runner.device)
        if self.tokenizer is not None and not seq.is_score and seq.params.detokenize:
            seq.detok = Detokenizer(self.tokenizer, seq.prompt_ids)
        self.scheduler.add(seq)
        if seq.params.max_tokens == 0 and not seq.is_score:
            self.scheduler.drop(seq)  # nothing to generate: reported as finished by the next step

    def abort(self, request_id: int) -> bool:
        seq = self.scheduler.find(request_id)
        if seq is None:
            return False
        self.scheduler.finish(seq, FinishReason.ABORT)
        return True

    def has_work(self) -> bool:
        return self.flight is not None or self.scheduler.has_work()

    def step(self) -> list[RequestDelta]:
        """Run one engine step; the deltas of every request that gained tokens or finished (overlapped: the
        deltas of the step launched by the previous call)."""
        if self.lands_late:
            return self._step_late()
        batch = self.scheduler.schedule()
        dropped = [make_delta(s, (), "", ()) for s in self.scheduler.drain_dropped()]
        if batch is None:
            return dropped
        out = self._run_batch(batch)
        early = self.spec.draft_early(out.inputs, out.verified) if self.spec is not None else None
        deltas = self._postprocess(batch, out, early)
        if self.spec is not None and early is None:  # the draft extends over the landed positions, proposes again
            self.spec.propose(self.spec.extends(out.inputs))
        return dropped + deltas

    def _run_batch(self, batch: ScheduledBatch) -> StepOutcome:
        """Forward the scheduled batch; verify its verify rows, sample its plain generating rows (the tokens
        stay on the device), score the rest."""
        mark_scheduled(batch)
        inputs = self.stepper.prepare(batch)
        logits = self.stepper.run(inputs, batch)
        nv = len(inputs.verify) * (self.spec.K + 1) if inputs.verify else 0
        verified = self.spec.verify(logits[:nv], inputs) if nv else None
        ns = len(inputs.sample_seqs)
        sampled = self._sample(logits[nv:nv + ns], inputs.sample_seqs) if ns else None
        if sampled is not None and self.spec is None:  # (under speculation they reach the draft from the host)
            self.runner.record(inputs, sampled.token_ids)
        self._score(logits[nv + ns:], inputs)
        lps = self.spec.verify_logprobs(logits[:nv], inputs, verified) if nv else (None, None)
        return StepOutcome(inputs, sampled, verified, lps)

    # ---- overlap: a plain step's tokens land one step late -------------------------------------------
    def _step_late(self) -> list[RequestDelta]:
        held = [s for s in self.flight.seqs if not s.finished] if self.flight is not None else []
        for seq in held:  # while scheduling and building inputs only: between steps outputs hold real tokens
            seq.output_ids.append(PLACEHOLDER)
        try:
            batch = self.scheduler.schedule()
            launched = self._launch(batch) if batch is not None else None
        finally:
            for seq in held:
                strip_placeholders(seq)
        dropped = self.scheduler.drain_dropped()  # (a token in flight is lost with it: the pool cannot hold it)
        deltas = self._land_flight(self.flight) if self.flight is not None else []
        self.flight = launched if launched is not None and pending(launched) else None
        return [make_delta(s, (), "", ()) for s in dropped] + deltas

    def _launch(self, batch: ScheduledBatch) -> Flight:
        out = self._run_batch(batch)
        host, done = to_host(out.sampled)
        finished = self._advance(batch)
        return Flight(out.inputs.sample_seqs, host, done, finished)

    def _advance(self, batch: ScheduledBatch) -> list[Sequence]:
        """The step's K/V counts as computed (stream order: later steps see it); the scoring requests done."""
        finished = []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            seq.num_computed += n
            self._commit_known(seq)
            if seq.is_score and seq.num_computed == seq.num_tokens:
                self.scheduler.finish(seq, FinishReason.STOP)
                finished.append(seq)
        return finished

    def _land_flight(self, flight: Flight) -> list[RequestDelta]:
        if flight.done is not None:
            flight.done.synchronize()
        deltas = []
        if flight.sampled is not None:
            tokens, lps, tops = fetch_sampled(flight.sampled)
            now = time.time()
            for i, seq in enumerate(flight.seqs):
                if not seq.finished:  # else it stopped one step earlier (an extra token), or was aborted / dropped
                    self._commit_known(seq)
                    deltas.append(self.land(seq, [tokens[i]], now, [lps and lps[i]], [tops and tops[i]]))
        return deltas + [make_delta(s, (), "", ()) for s in flight.finished]

    def _commit_known(self, seq: Sequence) -> None:
        """Register the computed full pages in the prefix cache, but only over tokens known on the host."""
        computed = seq.num_computed  # may count a placeholder's position (run by a step in flight)
        seq.num_computed = min(computed, seq.num_tokens - num_placeholders(seq))
        self.scheduler.bm.commit(seq)
        seq.num_computed = computed

    # ---- sampling and scoring ------------------------------------------------------------------------
    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        banned = [self._banned(s) for s in seqs]
        return self.sampler(logits, [s.params for s in seqs], [s.generator for s in seqs], banned)

    def _banned(self, seq: Sequence) -> list[int]:
        """Before min_tokens, EOS (unless ignored) and stop tokens may not be sampled."""
        if len(seq.output_ids) >= seq.params.min_tokens:
            return []
        return sorted((set() if seq.params.ignore_eos else self.eos) | set(seq.params.stop_token_ids))

    def _score(self, logits: torch.Tensor, inputs: StepInputs) -> None:
        if not inputs.score_counts:
            return
        lp = torch.log_softmax(logits.float(), dim=-1)
        chosen = lp.gather(-1, inputs.score_targets[:, None])[:, 0].tolist()
        greedy = (lp.argmax(-1) == inputs.score_targets).tolist()
        tops = _score_tops(lp, max(s.params.prompt_logprobs or 0 for s, _ in inputs.score_counts))
        at = 0
        for seq, n in inputs.score_counts:
            seq.score_logprobs += chosen[at:at + n]
            seq.score_greedy += greedy[at:at + n]
            if seq.params.prompt_logprobs is not None:
                seq.score_top += [row[:seq.params.prompt_logprobs] for row in tops[at:at + n]]
            at += n

    def _postprocess(self, batch: ScheduledBatch, out: StepOutcome,
                     verified: VerifiedOnHost | None = None) -> list[RequestDelta]:
        """Land the step in batch order (the step's device -> host syncs; `verified`: the verification's
        copy already queued, as the early draft does); scoring requests done last."""
        accepted, emitted = verified.lists() if verified is not None else fetch_verified(out.verified)
        tokens, lps, tops = fetch_sampled(out.sampled)
        now = time.time()
        verify, sampled = out.inputs.verify, out.inputs.sample_seqs
        deltas, vi, pi = [], 0, 0
        for seq, n in zip(batch.seqs, batch.num_tokens):
            if vi < len(verify) and verify[vi].seq is seq:
                lp, top = row_logprobs(out.verify_logprobs, vi, seq, accepted[vi] + 1)
                deltas.append(self._land_verified(verify[vi], accepted[vi], emitted[vi], now, lp, top))
                vi += 1
            elif pi < len(sampled) and sampled[pi] is seq:
                deltas.append(self._land_sampled(seq, n, now, tokens[pi], lps and lps[pi], tops and tops[pi]))
                pi += 1
            else:
                self._computed(seq, n)
        return deltas + [make_delta(s, (), "", ()) for s in batch.seqs if s.is_score and s.finished]

    def _land_verified(self, row: Row, a: int, out: list[int], now: float, lps: list, tops: list) -> RequestDelta:
        """The a accepted drafts and the bonus / correction token; the KV keeps L + a + 1 positions."""
        seq = row.seq
        self.spec.record(seq).add(proposed=len(row.drafts), accepted=a)
        seq.num_computed = row.start + a + 1  # rollback by length: positions past it are stale
        delta = self.land(seq, out[:a + 1], now, lps, tops)
        if not seq.finished:
            self.scheduler.bm.commit(seq)
        return delta

    def _land_sampled(self, seq: Sequence, n: int, now: float, token: int, lp, top) -> RequestDelta:
        if self.spec is not None and n == 1 and seq.output_ids:
            self.spec.record(seq).add(proposed=0, accepted=0)  # a decode step without drafts
        seq.num_computed += n
        self.scheduler.bm.commit(seq)
        return self.land(seq, [token], now, [lp], [top])

    def _computed(self, seq: Sequence, n: int) -> None:
        """A chunk that samples nothing: mid-prompt, or a scoring chunk (the last one finishes it)."""
        seq.num_computed += n
        self.scheduler.bm.commit(seq)
        if seq.is_score and seq.num_computed == seq.num_tokens:
            self.scheduler.finish(seq, FinishReason.STOP)

    def land(self, seq: Sequence, tokens: list[int], now: float, lps: list, tops: list) -> RequestDelta:
        """The one way tokens land, in every mode (a sampled token, a verify row's accepted drafts and
        bonus, an overlapped step's token one step late): append them in order with the stop rules
        (the first stop ends the run); one delta for what landed. lps / tops: per token, None without logprobs."""
        if not len(tokens) == len(lps) == len(tops):
            raise ValueError(f"{len(tokens)} tokens with {len(lps)} logprobs and {len(tops)} tops")
        if self._no_stop_within(seq, tokens):  # (the common run: the same appends without per-token checks)
            n = self._append_run(seq, tokens, now, lps, tops)
        else:
            n = 0
            for t, lp, top in zip(tokens, lps, tops):
                self._append(seq, t, now, lp, top)
                n += 1
                if seq.finished:
                    break
        delta = make_delta(seq, tuple(tokens[:n]), _new_text(seq), (now,) * n)
        if seq.params.logprobs is None:
            return delta
        return dataclasses.replace(delta, logprobs=tuple(seq.logprobs[-n:]),
                                   top_logprobs=tuple(tuple(t) for t in seq.top_logprobs[-n:]))

    def _no_stop_within(self, seq: Sequence, tokens: list[int]) -> bool:
        """No stop rule can fire while `tokens` land: no stop strings to match, no stop or EOS id among them,
        max_tokens and max_model_len beyond them."""
        p, n = seq.params, len(tokens)
        if (p.stop and seq.detok is not None) or len(seq.output_ids) + n >= p.max_tokens \
                or seq.num_tokens + n >= self.max_model_len:
            return False
        stops = p.stop_token_ids if p.ignore_eos else self.eos.union(p.stop_token_ids)
        return not any(t in stops for t in tokens)

    def _append_run(self, seq: Sequence, tokens: list[int], now: float, lps: list, tops: list) -> int:
        """`_append` of every token when no stop rule can fire (`_no_stop_within`)."""
        n = len(tokens)
        seq.output_ids += tokens
        seq.timings.token_s += [now] * n
        if seq.params.logprobs is not None:
            k = seq.params.logprobs
            seq.logprobs += lps
            seq.top_logprobs += [top[:k] if top else [] for top in tops]
        if seq.detok is not None:
            seq.text += "".join(seq.detok.add(t) for t in tokens)
        return n

    def _append(self, seq: Sequence, token: int, now: float, lp: float | None, top) -> None:
        """One token onto the request: its time, logprobs and text; finished when a stop rule fires."""
        seq.output_ids.append(token)
        seq.timings.token_s.append(now)
        if seq.params.logprobs is not None:
            seq.logprobs.append(lp)
            seq.top_logprobs.append(top[: seq.params.logprobs] if top else [])
        piece = seq.detok.add(token) if seq.detok is not None else ""
        seq.text += piece
        reason = self._stop_reason(seq, token, piece)
        if reason is not None:
            if seq.detok is not None:
                seq.text += seq.detok.flush()
                _cut_at_stop(seq)
            self.scheduler.finish(seq, reason)

    def _stop_reason(self, seq: Sequence, token: int, piece: str) -> FinishReason | None:
        p = seq.params
        n = len(seq.output_ids)
        stop_id = (token in self.eos and not p.ignore_eos) or token in p.stop_token_ids
        if n > p.min_tokens and stop_id:  # (the first min_tokens tokens could not be stop ids)
            return FinishReason.STOP
        if n >= p.min_tokens and piece and any(s in seq.text[-(len(s) + len(piece)):] for s in p.stop):
            return FinishReason.STOP
        if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None


def _cut_at_stop(seq: Sequence) -> None:
    """Drop the first stop string and all after it from the text (the token ids stay)."""
    hits = [i for i in (seq.text.find(s) for s in seq.params.stop) if i >= 0]
    if hits:
        seq.text = seq.text[: min(hits)]


def _new_text(seq: Sequence) -> str:
    """Text not yet streamed; while running, hold back what could still become a stop string."""
    hold = 0 if seq.finished else max((len(s) - 1 for s in seq.params.stop), default=0)
    end = max(len(seq.text) - hold, seq.num_emitted_chars)
    out = seq.text[seq.num_emitted_chars:end]
    seq.num_emitted_chars = end
    return out


def fetch_sampled(sampled: SamplerOutput | None) -> tuple[list[int], list | None, list | None]:
    """(tokens, logprobs or None, tops or None) on the host: the plain rows' device -> host sync."""
    if sampled is None:
        return [], None, None
    lps = sampled.logprobs.tolist() if sampled.logprobs is not None else None
    return sampled.token_ids.tolist(), lps, sampled_tops(sampled)


def fetch_verified(res: Any) -> tuple[list[int], list[list[int]]]:
    """(accepted count, emitted tokens) per verify row on the host: the verify rows' one sync."""
    return VerifiedOnHost(res).lists() if res is not None else ([], [])


def row_logprobs(lps: tuple, i: int, seq: Sequence, width: int) -> tuple[list, list]:
    """The first `width` (logprob, tops) of verify row i, or Nones when it asked for none."""
    chosen, tops = lps
    if chosen is None or seq.params.logprobs is None:
        return [None] * width, [None] * width
    return chosen[i][:width], tops[i][:width] if tops is not None else [None] * width


def make_delta(seq: Sequence, tokens: tuple[int, ...], text: str, times: tuple[float, ...]) -> RequestDelta:
    reason = seq.finish_reason.value if seq.finished and seq.finish_reason else None
    delta = RequestDelta(seq.request_id, tokens, text, times, seq.finished, reason)
    if seq.params.prompt_logprobs is None or seq.prompt_logprobs_sent or not seq.prompt_logprobs_done:
        return delta
    seq.prompt_logprobs_sent = True  # once, on the first delta after the prefill
    return dataclasses.replace(delta, prompt_logprobs=tuple(seq.score_logprobs),
                               prompt_top_logprobs=tuple(tuple(t) for t in seq.score_top))


def _score_tops(lp: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """(id, logprob) of the k best tokens of each row, best first ([] per row when k is 0)."""
    if k == 0:
        return [[] for _ in range(lp.shape[0])]
    vals, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)
    return [list(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]


def sampled_tops(sampled: SamplerOutput) -> list[list[tuple[int, float]]] | None:
    if sampled.top_ids is None:
        return None
    ids, lps = sampled.top_ids.tolist(), sampled.top_logprobs.tolist()
    return [list(zip(i, lp)) for i, lp in zip(ids, lps)]


def mark_scheduled(batch: ScheduledBatch) -> None:
    """Stamp the first time each request of `batch` is scheduled (host clock)."""
    now = time.time()
    for seq in batch.seqs:
        seq.timings.scheduled_s = seq.timings.scheduled_s or now
