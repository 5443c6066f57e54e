"""Overlap scheduling: step N+1 is scheduled and launched before step N's tokens reach the host.

    engine = OverlapEngine(runner, scheduler, sampler, tokenizer, eos_ids, max_model_len)
    while engine.has_work():
        deltas = engine.step()          # the deltas of the step launched by the previous call

Each call: schedule -> build inputs -> launch the model and the sampler (the sampled tokens stay on
the device as the next decode inputs; while the next step is scheduled and built, a PLACEHOLDER stands
for each on the host, so the scheduler sees one token to compute; between calls the outputs hold real
tokens only) -> read back the previous step's tokens (their copy was queued before this
launch, so the device keeps running) -> append them with the stop rules, one step late. A request
that stopped at step N also ran in step N+1: that extra token is discarded, so the tokens, text and
finish reasons equal `Engine`'s (greedy and seeded sampling; unseeded draws share one generator and
depend on the batch). Prefix-cache pages of a sampled request are committed when its token lands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from m3bench.runtime.decode_state import PLACEHOLDER
from m3bench.runtime.engine import Engine, RequestDelta, fetch_sampled, make_delta
from m3bench.runtime.sampler import SamplerOutput
from m3bench.runtime.scheduler import ScheduledBatch
from m3bench.runtime.sequence import FinishReason, Sequence


@dataclass(frozen=True)
class Flight:
    """A launched step whose sampled tokens have not been read on the host yet."""

    seqs: list[Sequence]  # the requests it sampled for, in the order of `sampled`
    sampled: SamplerOutput | None  # host tensors, valid once `done` has fired
    done: Any  # torch.cuda.Event, or None when the tensors are already on the host
    finished: list[Sequence]  # scoring requests the step completed


class OverlapEngine(Engine):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flight: Flight | None = None

    def has_work(self) -> bool:
        return self.flight is not None or self.scheduler.has_work()

    def step(self) -> list[RequestDelta]:
        held = [s for s in self.flight.seqs if not s.finished] if self.flight is not None else []
        for seq in held:  # while scheduling and building inputs only: between calls outputs hold real tokens
            seq.output_ids.append(PLACEHOLDER)
        try:
            batch = self.scheduler.schedule()
            launched = self._launch(batch) if batch is not None else None
        finally:
            for seq in held:
                strip_placeholders(seq)
        dropped = self.scheduler.drain_dropped()  # (a token in flight is lost with it: the pool cannot hold it)
        deltas = self._land(self.flight) if self.flight is not None else []
        self.flight = launched if launched is not None and _pending(launched) else None
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

    def _land(self, flight: Flight) -> list[RequestDelta]:
        if flight.done is not None:
            flight.done.synchronize()
        deltas = []
        if flight.sampled is not None:
            tokens, lps, tops = fetch_sampled(flight.sampled)
            now = time.time()
            for i, seq in enumerate(flight.seqs):
                delta = self._land_one(seq, tokens[i], now, lps and lps[i], tops and tops[i])
                if delta is not None:
                    deltas.append(delta)
        return deltas + [make_delta(s, (), "", ()) for s in flight.finished]

    def _land_one(self, seq: Sequence, token: int, now: float, lp: float | None, top) -> RequestDelta | None:
        """Append the landed token with the stop rules; None when the request ended meanwhile."""
        if seq.finished:  # stopped one step earlier (this is the extra token), aborted or dropped
            return None
        self._commit_known(seq)
        return self.land(seq, [token], now, [lp], [top])

    def _commit_known(self, seq: Sequence) -> None:
        """Register the computed full pages in the prefix cache, but only over tokens known on the host."""
        computed = seq.num_computed  # may count a placeholder's position (run by a step in flight)
        seq.num_computed = min(computed, seq.num_tokens - num_placeholders(seq))
        self.scheduler.bm.commit(seq)
        seq.num_computed = computed


def _pending(flight: Flight) -> bool:
    """Whether landing `flight` still has something to report (else its tokens are all extra ones)."""
    return bool(flight.finished) or not all(s.finished for s in flight.seqs)


def num_placeholders(seq: Sequence) -> int:
    """Trailing placeholders of `seq`'s output (tokens of steps in flight)."""
    ids, k = seq.output_ids, 0
    while k < len(ids) and ids[-1 - k] == PLACEHOLDER:
        k += 1
    return k


def strip_placeholders(seq: Sequence) -> int:
    """Remove the trailing placeholders of `seq`'s output; how many there were."""
    ids, k = seq.output_ids, num_placeholders(seq)
    if k:
        del ids[len(ids) - k:]
    return k


def to_host(sampled: SamplerOutput | None) -> tuple[SamplerOutput | None, Any]:
    """Queue the copy of the sampled tensors to pinned host memory; (host copies, event that fires when done)."""
    if sampled is None or sampled.token_ids.device.type != "cuda":
        return sampled, None
    copies = [None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
              for t in (sampled.token_ids, sampled.logprobs, sampled.top_ids, sampled.top_logprobs)]
    done = torch.cuda.Event()
    done.record()
    return SamplerOutput(*copies), done
