"""compute_metrics on a hand-made trace equals hand-computed values (vLLM bench serve definitions)."""

import pytest

from m3bench.bench.metrics import EmptySampleError, compute_metrics, spec_metrics
from m3bench.bench.records import RequestRecord, Slo, SpecCounters

A = pytest.approx


def _trace() -> list[RequestRecord]:
    return [
        # spec-decode chunks carrying 1, 3, 2 tokens: TTFT 100, E2EL 250, TPOT 150/5 = 30, ITL 50, 100
        RequestRecord(0.0, (0.100, 0.150, 0.250), (1, 3, 2), prompt_tokens=10, output_tokens=6),
        # TTFT 200, E2EL 260, TPOT 60, ITL 60
        RequestRecord(1.0, (1.200, 1.260), (1, 1), prompt_tokens=20, output_tokens=2),
        # one-token output: TTFT = E2EL = 50, no TPOT, no ITL
        RequestRecord(2.0, (2.050,), (1,), prompt_tokens=30, output_tokens=1),
        # failed: counted, never averaged in
        RequestRecord(3.0, (), (), prompt_tokens=40, output_tokens=0, error="HTTP 500"),
    ]


def test_latencies_equal_hand_computed():
    m = compute_metrics(_trace(), duration_s=4.0, tp=2)
    assert (m.num_requests, m.num_completed, m.num_failed) == (4, 3, 1)
    assert (m.ttft_ms.mean, m.ttft_ms.median, m.ttft_ms.p90, m.ttft_ms.p99) == (A(350 / 3), A(100), A(180), A(198))
    assert m.ttft_ms.std == A((11666.6667 / 3) ** 0.5)
    assert (m.tpot_ms.mean, m.tpot_ms.median, m.tpot_ms.p90, m.tpot_ms.p99, m.tpot_ms.std) == (
        A(45), A(45), A(57), A(59.7), A(15))
    # ITL pools chunk gaps: 50, 100, 60 (differs from TPOT: chunk 2 carried 3 tokens)
    assert (m.itl_ms.mean, m.itl_ms.median, m.itl_ms.p90, m.itl_ms.p99) == (A(70), A(60), A(92), A(99.2))
    assert m.itl_ms.std == A((1400 / 3) ** 0.5)
    assert (m.e2el_ms.mean, m.e2el_ms.median, m.e2el_ms.p90, m.e2el_ms.p99) == (A(560 / 3), A(250), A(258), A(259.8))


def test_throughput_and_interactivity():
    m = compute_metrics(_trace(), duration_s=4.0, tp=2)
    assert (m.total_prompt_tokens, m.total_output_tokens) == (60, 9)
    assert (m.request_per_s, m.output_tok_per_s, m.total_tok_per_s) == (A(0.75), A(2.25), A(17.25))
    assert m.total_tok_per_s_per_gpu == A(8.625)
    assert m.interactivity_median == A(1000 / 45)
    assert m.interactivity_x90 == A(1000 / 57)
    assert m.goodput_req_per_s is None and m.spec is None


def test_goodput_counts_requests_meeting_every_slo():
    m = compute_metrics(_trace(), duration_s=4.0, slo=Slo(ttft_ms=150, tpot_ms=50))
    assert m.goodput_req_per_s == A(2 / 4)  # request 2 misses TTFT; the one-token request has no TPOT to miss
    m = compute_metrics(_trace(), duration_s=4.0, slo=Slo(e2el_ms=255))
    assert m.goodput_req_per_s == A(2 / 4)


def test_spec_figures():
    s = spec_metrics(SpecCounters(drafts=10, draft_tokens=30, accepted_tokens=15, accepted_per_pos=(8, 5, 2)))
    assert s.acceptance_rate == A(0.5) and s.acceptance_length == A(2.5)
    assert s.per_position_rate == (A(0.8), A(0.5), A(0.2))
    assert s.accepted_histogram == (2, 3, 3, 2)
    m = compute_metrics(_trace(), 4.0, spec=SpecCounters(10, 30, 15, (8, 5, 2)))
    assert m.spec == s and m.to_flat_dict()["spec_acceptance_length"] == A(2.5)


def test_spec_counter_window():
    after = SpecCounters(12, 36, 20, (9, 7, 4))
    assert after.minus(SpecCounters(2, 6, 5, (1, 2))) == SpecCounters(10, 30, 15, (8, 5, 4))


def test_empty_samples_raise():
    failed = [r for r in _trace() if r.error]
    with pytest.raises(EmptySampleError):
        compute_metrics(failed, 1.0)
    with pytest.raises(EmptySampleError):
        compute_metrics([], 1.0)
    one_token = [_trace()[2]]
    with pytest.raises(EmptySampleError, match="TPOT"):
        compute_metrics(one_token, 1.0)
    with pytest.raises(EmptySampleError):
        compute_metrics(_trace(), 0.0)
    with pytest.raises(EmptySampleError):
        spec_metrics(SpecCounters(0, 0, 0))
    one_chunk = [RequestRecord(0.0, (0.5,), (8,), prompt_tokens=4, output_tokens=8)]  # not streamed
    with pytest.raises(EmptySampleError, match="one chunk"):
        compute_metrics(one_chunk, 1.0)


def test_flat_dict_has_units_in_names():
    flat = compute_metrics(_trace(), 4.0).to_flat_dict()
    assert flat["ttft_ms_p99"] == A(198) and flat["tpot_ms_median"] == A(45)
    assert flat["total_tok_per_s_per_gpu"] == A(17.25)


def test_records_round_trip(tmp_path):
    from m3bench.bench.records import read_records, write_records

    write_records(tmp_path / "r.jsonl", _trace())
    assert read_records(tmp_path / "r.jsonl") == _trace()


def test_host_timing_on_a_hand_made_window():
    from m3bench.bench.metrics import compute_host_timing
    from m3bench.runtime.step_timing import StepRecord

    steps = [StepRecord(0.010, 0.006), StepRecord(0.020, 0.005), StepRecord(0.004, 0.004)]
    t = compute_host_timing(steps, window_s=0.050)
    assert t.engine_steps == 3
    assert t.host_ms_per_step_median == pytest.approx(4.0)  # host ms: 4, 15, 0
    assert t.host_ms_per_step_p90 == pytest.approx(12.8)  # numpy's linear P90 of (0, 4, 15)
    assert t.device_idle_share == pytest.approx(1 - 0.015 / 0.050)
    assert compute_host_timing([StepRecord(0.01, 0.02)], 0.01).host_ms_per_step_median == 0.0  # never negative
    with pytest.raises(EmptySampleError):
        compute_host_timing([], 1.0)
