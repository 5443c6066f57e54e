"""The engine's step clock: one record per engine step, its forward time inside its wall time."""

from __future__ import annotations

import pytest

from m3bench.runtime.llm import LLM, SamplingParams
from m3bench.runtime.step_timing import StepClock

KW = dict(kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=4)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from m3bench.runtime.speculative.tiny_draft import write_tiny_draft
    from m3bench.runtime.tiny import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("timing")
    ckpt = write_tiny_checkpoint(root / "tiny", seed=0)
    write_tiny_draft(root / "draft", ckpt)
    return ckpt, root / "draft"


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "eagle3"])
def test_every_step_is_timed_and_its_forward_is_inside_it(pair, speculative):
    ckpt, draft = pair
    llm = LLM(str(ckpt), speculative_model=draft if speculative else None, **KW)
    mark = llm.clock.mark()
    calls = []
    step = llm.engine.step
    llm.engine.step = lambda: calls.append(1) or step()  # count the engine steps the clock should see
    llm.generate([[5, 9, 200, 31], [1, 2, 3]], SamplingParams(max_tokens=6, ignore_eos=True))
    records = llm.clock.since(mark)
    assert len(records) == len(calls) >= 3
    assert all(0 <= r.forward_s <= r.step_s for r in records)
    assert sum(r.forward_s > 0 for r in records) >= len(records) - 1  # every step with a batch ran a forward
    assert llm.clock.since(llm.clock.mark()) == []


def test_forwards_outside_a_step_are_not_counted():
    clock = StepClock()
    with clock.forward():  # profiling, graph capture
        pass
    with clock.step():
        with clock.step():  # nested: one step
            with clock.forward():
                pass
    (record,) = clock.since(0)
    assert 0 <= record.forward_s <= record.step_s


class FakeEvent:
    """A CUDA event stand-in: completes when the test says so; 'device time' = ms between record calls."""

    clock_ms = 0.0
    done = False

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = None

    def record(self) -> None:
        FakeEvent.clock_ms += 2.5
        self.at = FakeEvent.clock_ms

    def query(self) -> bool:
        return FakeEvent.done

    def synchronize(self) -> None:
        FakeEvent.done = True

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.at - self.at


def test_cuda_forwards_are_read_from_events_once_complete(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(FakeEvent, "done", False)
    clock = StepClock(cuda=True)
    for _ in range(3):
        with clock.step():
            with clock.forward():
                pass
    assert clock.in_flight == 3  # the events are kept until they complete
    FakeEvent.done = True
    with clock.step():
        pass
    assert clock.in_flight == 0  # completed steps hold seconds, not events
    records = clock.since(0)
    assert [r.forward_s for r in records] == [pytest.approx(0.0025)] * 3 + [0.0]
