"""Overlap mode of the step loop (Engine(..., overlap=True), EngineConfig.async_scheduling): step N + 1 is
scheduled and launched before step N's tokens reach the host. These are its pieces; the loop is engine.py's.

Each step: schedule -> build inputs -> launch the model and the sampler (the sampled tokens stay on the
device as the next decode inputs; while the next step is scheduled and built, a PLACEHOLDER stands for
each on the host, so the scheduler sees one token to compute; between steps the outputs hold real
tokens only) -> read back the previous step's tokens (their copy was queued before this launch, so the
device keeps running) -> land them with the stop rules, one step late. A request that stopped at step N
also ran in step N + 1: that extra token is discarded, so the tokens, text and finish reasons equal the
synchronous loop's (greedy and seeded sampling; unseeded draws share one generator and depend on the
batch). Prefix-cache pages of a sampled request are committed when its token lands.

Under speculation the verify row's accepted count decides the next step's rows, so the step lands at
once; overlap there means the draft chain's tokens stay on the device (SpecRunner.drafts_on_device) and
the next step is scheduled and built while the chain runs. A pure greedy verify step launches its whole
draft before it lands (SpecRunner.draft_early): the verification's copy to the host is queued first
(VerifiedOnHost), so the host lands the tokens while the draft runs.

    flight = Flight(seqs, *to_host(sampled), finished)   # a launched step; land it on the next step
    host = VerifiedOnHost(res); accepted, emitted = host.lists()   # a verification, read when needed
    strip_placeholders(seq)                              # the host's stand-ins for tokens in flight
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from m3bench.runtime.decode_state import PLACEHOLDER
from m3bench.runtime.sampler import SamplerOutput
from m3bench.runtime.sequence import Sequence


@dataclass(frozen=True)
class Flight:
    """A launched step whose sampled tokens have not been read on the host yet."""

    seqs: list[Sequence]  # the requests it sampled for, in the order of `sampled`
    sampled: SamplerOutput | None  # host tensors, valid once `done` has fired
    done: Any  # torch.cuda.Event, or None when the tensors are already on the host
    finished: list[Sequence]  # scoring requests the step completed


def pending(flight: Flight) -> bool:
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
    copies, done = to_pinned([sampled.token_ids, sampled.logprobs, sampled.top_ids, sampled.top_logprobs])
    return SamplerOutput(*copies), done


def to_pinned(tensors: list) -> tuple[list, Any]:
    """Queue each CUDA tensor's copy (None stays None) to pinned host memory; (copies, event fired when done)."""
    copies = [None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
              for t in tensors]
    done = torch.cuda.Event()
    done.record()
    return copies, done


class VerifiedOnHost:
    """A verification's (accepted count, emitted tokens) per verify row, its copy to pinned host memory queued
    at construction (CUDA): reading it later waits for the verification only, not for work launched since."""

    def __init__(self, res: Any) -> None:
        both = torch.cat((res.num_accepted[:, None], res.output_tokens), dim=1)
        self.host, self.done, self._lists = both, None, None
        if both.device.type == "cuda":
            (self.host,), self.done = to_pinned([both])

    def lists(self) -> tuple[list[int], list[list[int]]]:
        """(accepted, emitted) as host lists (the one sync, once)."""
        if self._lists is None:
            if self.done is not None:
                self.done.synchronize()
            rows = self.host.tolist()
            self._lists = ([r[0] for r in rows], [r[1:] for r in rows])
        return self._lists
