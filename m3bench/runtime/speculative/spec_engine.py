"""The engine step with one-model Eagle3 speculation: schedule -> target (verify + prefill) -> accept ->
draft (extend + chain). Everything else (admission, stop rules, detokenizing, deltas) is `Engine`'s.

    engine = SpecEngine(runner, scheduler, sampler, tokenizer, eos_ids, max_model_len, spec_runner)

Per step, in one target forward: verify rows (requests with drafts: [last token, d_1..d_K]), prefill
chunks of new or resumed requests, plain decode rows (logprobs / min_tokens requests, sampled by the
engine's sampler) and scoring rows. One device -> host sync for the accepted tokens, one for the drafts;
under overlap (async_scheduling: spec.drafts_on_device) only the first: the drafts stay on the device,
and the next step is scheduled and built on the host while the draft's extend and chain run, its verify
rows taking their drafts on the device. Tokens land through `Engine.land`, as in every mode.
"""

from __future__ import annotations

import time

import torch

from m3bench.runtime.engine import Engine, RequestDelta, make_delta, mark_scheduled, sampled_tops
from m3bench.runtime.sequence import FinishReason, Sequence
from m3bench.runtime.speculative.runner import Extend, SpecRunner, eligible
from m3bench.runtime.step_rows import Row, StepInputs


class SpecEngine(Engine):
    def __init__(self, runner, scheduler, sampler, tokenizer, eos_token_ids, max_model_len: int,
                 spec: SpecRunner) -> None:
        super().__init__(runner, scheduler, sampler, tokenizer, eos_token_ids, max_model_len)
        self.spec = spec

    def step(self) -> list[RequestDelta]:
        batch = self.scheduler.schedule()
        dropped = [make_delta(s, (), "", ()) for s in self.scheduler.drain_dropped()]
        if batch is None:
            return dropped
        mark_scheduled(batch)
        step = self.spec.prepare(batch)
        logits = self.spec.run_target(step)
        nv, npl = len(step.verify) * (self.spec.K + 1), len(step.plain)
        res = self.spec.verify(logits[:nv], step) if step.verify else None
        sampled = self._sample(logits[nv:nv + npl], [r.seq for r in step.plain]) if npl else None
        self._score(logits[nv + npl:], step)
        self._lps = _verify_logprobs(logits[:nv], step, res) if step.verify else (None, None)
        extends: list[Extend] = []
        deltas = self._postprocess_spec(step, res, sampled, extends)
        self.spec.propose(extends)
        return dropped + deltas

    def _postprocess_spec(self, step: StepInputs, res, sampled, extends: list[Extend]) -> list[RequestDelta]:
        accepted, emitted = self._fetch(res)
        tokens, lps, tops = self._fetch_sampled(sampled)
        now = time.time()
        deltas, vi, pi = [], 0, 0
        plain = {id(r) for r in step.plain}
        self._verify_index = {id(r): i for i, r in enumerate(step.verify)}
        for row in step.rows:
            seq = row.seq
            if row.drafts:
                deltas.append(self._accept(row, accepted[vi], emitted[vi], now, extends))
                vi += 1
            elif id(row) in plain:
                deltas.append(self._plain(row, tokens[pi], now, lps and lps[pi], tops and tops[pi], extends))
                pi += 1
            else:
                self._computed(row, extends)
                if seq.is_score and seq.finished:
                    deltas.append(make_delta(seq, (), "", ()))
        return deltas

    @staticmethod
    def _fetch(res) -> tuple[list[int], list[list[int]]]:
        if res is None:
            return [], []
        both = torch.cat((res.num_accepted[:, None], res.output_tokens), dim=1).tolist()  # the step's sync
        return [r[0] for r in both], [r[1:] for r in both]

    @staticmethod
    def _fetch_sampled(sampled):
        if sampled is None:
            return [], None, None
        lps = sampled.logprobs.tolist() if sampled.logprobs is not None else None
        return sampled.token_ids.tolist(), lps, sampled_tops(sampled)

    def _accept(self, row: Row, a: int, out: list[int], now: float, extends: list[Extend]) -> RequestDelta:
        """Emit the a accepted drafts and the bonus / correction token; the KV keeps L + a + 1 positions."""
        seq = row.seq
        self.spec.record(seq).add(proposed=len(row.drafts), accepted=a)
        seq.num_computed = row.start + a + 1  # rollback by length: positions past it are stale
        merged = self.land(seq, out[:a + 1], now, *self._row_logprobs(row, a + 1))
        if not seq.finished:
            self.scheduler.bm.commit(seq)
            extends.append(Extend(seq, row.start, seq.num_computed, list(range(row.base, row.base + a + 1)),
                                  eligible(seq)))
        return merged

    def _row_logprobs(self, row: Row, width: int) -> tuple[list, list]:
        chosen, tops = self._lps
        if chosen is None or row.seq.params.logprobs is None:
            return [None] * width, [None] * width
        i = self._verify_index[id(row)]
        return chosen[i][:width], tops[i][:width] if tops is not None else [None] * width

    def _plain(self, row: Row, token: int, now: float, lp, top, extends: list[Extend]) -> RequestDelta:
        seq = row.seq
        if row.length == 1 and seq.output_ids:
            self.spec.record(seq).add(proposed=0, accepted=0)  # a decode step without drafts
        seq.num_computed += row.length
        self.scheduler.bm.commit(seq)
        delta = self.land(seq, [token], now, [lp], [top])
        if not seq.finished:
            extends.append(Extend(seq, row.start, seq.num_computed, list(range(row.base, row.base + row.length)),
                                  eligible(seq)))
        return delta

    def _computed(self, row: Row, extends: list[Extend]) -> None:
        """A prefill chunk that samples nothing (mid-prompt), or a scoring chunk."""
        seq = row.seq
        seq.num_computed += row.length
        self.scheduler.bm.commit(seq)
        if seq.is_score:
            if seq.num_computed == seq.num_tokens:
                self.scheduler.finish(seq, FinishReason.STOP)
            return
        extends.append(Extend(seq, row.start, seq.num_computed, list(range(row.base, row.base + row.length)), False))


def _verify_logprobs(logits: torch.Tensor, step: StepInputs, res) -> tuple[list | None, list | None]:
    """Per verify row and position: the emitted token's logprob (and the top n), when any row asks."""
    wanted = [r.seq.params.logprobs for r in step.verify if r.seq.params.logprobs is not None]
    if not wanted:
        return None, None
    lp = torch.log_softmax(logits.float(), dim=-1).view(len(step.verify), -1, logits.shape[-1])
    chosen = lp.gather(-1, res.output_tokens.clamp(min=0)[..., None])[..., 0].tolist()
    n = max(wanted)
    if n == 0:
        return chosen, None
    top_lp, top_ids = lp.topk(min(n, lp.shape[-1]), dim=-1)
    tops = [[list(zip(i, v)) for i, v in zip(ri, rv)] for ri, rv in zip(top_ids.tolist(), top_lp.tolist())]
    return chosen, tops
