"""Sequential testing (--sequential): Wald's SPRT over item batches, checked by simulation (10,000 runs each)
and through run_task on real MMLU items."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from m3bench.evals.backends.base import ScoreResult
from m3bench.evals.gate import Verdict, make_gate, sigma_from_reference
from m3bench.evals.protocols import Task
from m3bench.evals.protocols.base import Settings
from m3bench.evals.references import RunSpec
from m3bench.evals.runner import RunPlan, run_task
from m3bench.evals.sequential import Sprt, boundaries, simulate
from m3bench.runtime.errors import InputError
from shared_data import SHARED_DATA as SHARED

RUNS = 10_000


@pytest.mark.parametrize("ref, n, sigma", [(91.32, 1319, 50.0), (85.11, 4096, 50.0),
                                           (91.32, 1319, sigma_from_reference(91.32)), (60.0, 200, 50.0)])
def test_simulated_false_alarm_power_and_stopping_n(ref, n, sigma):
    gate = make_gate(ref, n, sigma)
    sprt = Sprt.for_gate(gate)
    false_alarm, n_null = simulate(sprt, gate, n, 50, ref / 100, RUNS, seed=1)
    power, n_alt = simulate(sprt, gate, n, 50, (ref - gate.theta) / 100, RUNS, seed=2)
    print(f"ref {ref} n {n} sigma {sigma:.1f} theta {gate.theta:.2f}: false alarm {false_alarm:.4f} "
          f"(mean stop n {n_null:.0f}), power {power:.4f} (mean stop n {n_alt:.0f})")
    assert false_alarm <= gate.alpha and power >= 1 - gate.beta
    assert n_null < n and n_alt < n  # it stops early on average


def test_the_simulation_catches_a_broken_rule():
    """Guard: bounds built for alpha 0.3 (a broken rule) give a false-alarm rate the test above rejects."""
    gate = make_gate(91.32, 1319)
    good = Sprt.for_gate(gate)
    broken = Sprt(good.p0, good.p1, 0.3, good.beta)
    assert simulate(broken, gate, 1319, 50, 0.9132, RUNS, seed=1)[0] > gate.alpha
    swapped = Sprt(good.p1, good.p0, good.alpha, good.beta)  # H0 and H1 exchanged
    assert simulate(swapped, gate, 1319, 50, 0.9132, RUNS, seed=1)[0] > gate.alpha


def test_decide_bounds_and_inputs():
    sprt = Sprt.for_gate(make_gate(90.0, 1000))
    assert sprt.decide(900.0, 1000) is Verdict.PASS and sprt.decide(700.0, 1000) is Verdict.FAIL
    assert sprt.decide(9.0, 10) is None  # too early to tell
    assert boundaries(120, 50) == [50, 100, 120]
    with pytest.raises(InputError, match="needs 0 < reference - theta"):
        Sprt.for_gate(make_gate(0.0, 8, floor=0.0))  # the tiny model's GSM8K golden: nothing to detect


class CoinBackend:
    """MMLU scorer right on a fixed pseudo-random fraction of items (a function of the prompt)."""

    name = "coin"

    def __init__(self, gold_of: dict[str, str], right_rate: float):
        self.gold_of, self.rate, self.scored = gold_of, right_rate, 0

    def score(self, requests, on_done):
        self.scored += len(requests)
        for i, r in enumerate(requests):
            gold = self.gold_of[r.context]
            u = int(hashlib.sha256(r.context.encode()).hexdigest()[:8], 16) / 2**32
            best = gold if u < self.rate else ("B" if gold == "A" else "A")
            on_done(i, ScoreResult(-1.0 if r.continuation.strip() == best else -5.0, False))

    def describe(self):
        return {"model": "coin", "rate": self.rate}

    def close(self):
        pass


@pytest.mark.skipif(not (SHARED / "mmlu" / "test.jsonl").is_file(), reason="no shared data copy")
@pytest.mark.parametrize("rate, verdict", [(0.80, "pass"), (0.62, "fail")])
def test_run_task_stops_early_and_records_the_stopping_n(tmp_path, rate, verdict):
    from m3bench.evals.protocols import get_protocol
    from m3bench.evals.runner import load_splits

    ref = tmp_path / "ref.yaml"
    ref.write_text("org/model:\n  - accuracy: 78.0\n    protocol: mmlu\n    protocol_version: lm-eval-mmlu-1.0/m3bench-1\n"
                   "    num_fewshot: 0\n    chat: false\n")
    settings = Settings(limit=1000)
    protocol = get_protocol(Task.MMLU)
    items = protocol.build_items(load_splits(protocol, settings, SHARED), settings)
    backend = CoinBackend({i.requests[0].context: i.gold for i in items}, rate)
    plan = RunPlan(Task.MMLU, settings, "org/model", "/nowhere", None, RunSpec(), tmp_path / "out", SHARED, ref, True,
                   sequential_batch=25)
    summary, paths = run_task(plan, backend, progress=False)
    q = summary["sequential"]
    assert summary["verdict"] == verdict and q["decided_by"] == "sprt" and q["n_max"] == 1000
    assert q["stopped_at"] < 1000 and q["stopped_at"] % 25 == 0 and summary["n"] == q["stopped_at"]
    assert backend.scored == 4 * q["stopped_at"] and len(paths.items.read_text().splitlines()) == q["stopped_at"]
    assert summary["threshold"] == pytest.approx(make_gate(78.0, 1000).threshold)


def test_cli_sequential_needs_a_reference(tmp_path):
    from typer.testing import CliRunner

    from m3bench.cli.main import app

    args = ["accuracy", "--model", "served", "--backend", "openai", "--base-url", "http://127.0.0.1:9",
            "--sequential", "--no-reference", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--sequential needs a reference gate" in result.output
