"""Paired comparison (--baseline): McNemar's exact test and the paired difference, on hand-made journals and
through run_task on real MMLU items with an oracle backend and one that breaks chosen items."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from m3bench.evals.backends.base import ScoreResult
from m3bench.evals.gate import Verdict, make_gate
from m3bench.evals.paired import find_baseline, mcnemar_exact, pair_records, paired_test
from m3bench.evals.protocols import Task
from m3bench.evals.protocols.base import Settings
from m3bench.evals.references import RunSpec
from m3bench.evals.runner import RunPlan, run_task
from m3bench.runtime.errors import InputError
from shared_data import SHARED_DATA as SHARED


def journal(right: list[bool], prefix: str = "p") -> dict[str, dict]:
    return {f"test/{i}": {"id": f"test/{i}", "prompt_sha256": f"{prefix}{i}", "value": float(r), "correct": {"acc": r}}
            for i, r in enumerate(right)}


def test_mcnemar_exact_values():
    assert mcnemar_exact(7, 2)[0] == pytest.approx((36 + 9 + 1) / 512)  # P(X >= 7), X ~ Bin(9, 1/2)
    assert mcnemar_exact(10, 0) == (pytest.approx(2**-10), pytest.approx(2 * 2**-10))
    assert mcnemar_exact(0, 0) == (1.0, 1.0) and mcnemar_exact(5, 5)[1] == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in ((13, 4), (3, 11), (40, 25)):
        want = scipy_stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue
        assert mcnemar_exact(b, c)[0] == pytest.approx(want, rel=1e-9)
        assert mcnemar_exact(b, c)[1] == pytest.approx(scipy_stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_a_regression_the_unpaired_gate_misses_fails_the_paired_test():
    """200 items, baseline 80% right; 12 right answers turn wrong (-6 points): the reference gate at n=200
    (threshold ref - 8.2) passes it, McNemar (b=12, c=0, p=2^-12) does not."""
    base = [i % 5 != 0 for i in range(200)]
    now = list(base)
    flipped = [i for i, r in enumerate(base) if r][:12]
    for i in flipped:
        now[i] = False
    current = list(journal(now).values())
    result = paired_test(current, journal(base), "acc")
    assert (result.baseline_only_right, result.current_only_right, result.n) == (12, 0, 200)
    assert result.p_value == pytest.approx(2**-12) and result.verdict is Verdict.FAIL
    assert result.difference == pytest.approx(-6.0)
    d = [-1.0] * 12 + [0.0] * 188
    assert result.stderr == pytest.approx(100 * math.sqrt(sum((x + 0.06) ** 2 for x in d) / 199 / 200))
    assert make_gate(80.0, 200).verdict(74.0) is Verdict.PASS  # the unpaired gate cannot see it


def test_small_or_balanced_changes_pass():
    base = [True, False] * 50
    one_flip = list(base)
    one_flip[0] = False
    assert paired_test(list(journal(one_flip).values()), journal(base), "acc").verdict is Verdict.PASS  # p = 1/2
    swapped = [not r for r in base]  # 50 lost, 50 gained
    result = paired_test(list(journal(swapped).values()), journal(base), "acc")
    assert result.verdict is Verdict.PASS and result.difference == 0.0 and result.p_value > 0.5


def test_too_few_pairs_cannot_fail_and_say_so():
    """4 pairs, all right before and wrong now: p = 1/16 is still not below alpha 0.05, so no result of 4 pairs can
    fail; 5 pairs can (1/32)."""
    four = paired_test(list(journal([False] * 4).values()), journal([True] * 4), "acc")
    assert four.verdict is Verdict.PASS and four.p_value == pytest.approx(1 / 16) and not four.can_fail
    five = paired_test(list(journal([False] * 5).values()), journal([True] * 5), "acc")
    assert five.verdict is Verdict.FAIL and five.can_fail


def test_different_items_are_refused():
    base = journal([True] * 5)
    with pytest.raises(InputError, match="no record of 1 of 6"):
        pair_records(list(journal([True] * 6).values()), base)
    with pytest.raises(InputError, match="asked differently"):
        pair_records(list(journal([True] * 5, prefix="q").values()), base)


# ---- through run_task on real MMLU items --------------------------------------------------------------


class OracleBackend:
    """Gives the gold continuation the highest logprob, except for the items it is told to break."""

    name = "oracle"

    def __init__(self, gold_of: dict[str, str], broken: set[str] = frozenset()):
        self.gold_of, self.broken = gold_of, broken

    def score(self, requests, on_done):
        for i, r in enumerate(requests):
            gold = self.gold_of[r.context]
            best = ("B" if gold == "A" else "A") if r.context in self.broken else gold
            on_done(i, ScoreResult(-1.0 if r.continuation.strip() == best else -5.0, False))

    def describe(self):
        return {"model": "oracle", "broken": len(self.broken)}

    def close(self):
        pass


def _plan(tmp: Path, out: str, baseline: Path | None = None) -> RunPlan:
    return RunPlan(Task.MMLU, Settings(limit=40), "org/model", "/nowhere", None, RunSpec(), tmp / out, SHARED,
                   None, False, baseline)


@pytest.mark.skipif(not (SHARED / "mmlu" / "test.jsonl").is_file(), reason="no shared data copy")
def test_baseline_run_gates_by_mcnemar(tmp_path):
    from m3bench.evals.protocols import get_protocol
    from m3bench.evals.runner import load_splits

    protocol = get_protocol(Task.MMLU)
    items = protocol.build_items(load_splits(protocol, Settings(limit=40), SHARED), Settings(limit=40))
    gold_of = {item.requests[0].context: item.gold for item in items}
    base, base_paths = run_task(_plan(tmp_path, "base"), OracleBackend(gold_of), progress=False)
    assert base["score"] == 100.0
    prompts = [item.requests[0].context for item in items]
    bad, _ = run_task(_plan(tmp_path, "bad", base_paths.summary), OracleBackend(gold_of, set(prompts[:8])), progress=False)
    assert bad["verdict"] == "fail" and bad["paired"]["baseline_only_right"] == 8
    assert bad["paired"]["p_value"] == pytest.approx(2**-8) and bad["baseline"]["run_key"] == base["run_key"]
    ok, _ = run_task(_plan(tmp_path, "ok", tmp_path / "base"), OracleBackend(gold_of, set(prompts[:2])), progress=False)
    assert ok["verdict"] == "pass" and ok["paired"]["p_value"] == pytest.approx(0.25)  # a results dir works too
    written = json.loads(next((tmp_path / "ok").glob("*.summary.json")).read_text())
    assert written["paired"]["verdict"] == "pass"
    import xml.etree.ElementTree as ET

    from m3bench.evals.junit import write_junit

    case = ET.parse(write_junit(tmp_path / "j.xml", [bad, ok], "org/model")).getroot().findall("testsuite/testcase")
    assert case[0].find("failure") is not None and "McNemar p=0.003906" in case[0].find("failure").get("message")
    assert case[1].find("failure") is None
    with pytest.raises(InputError, match="a mmlu run"):
        find_baseline(base_paths.summary, "gsm8k", "v", {})


def test_cli_baseline_and_reference_exclude_each_other(tmp_path):
    from typer.testing import CliRunner

    from m3bench.cli.main import app

    ref = tmp_path / "r.yaml"
    ref.write_text("org/m: []\n")
    args = ["accuracy", "--model", "served", "--backend", "openai", "--base-url", "http://127.0.0.1:9",
            "--baseline", str(tmp_path), "--reference", str(ref), "--no-progress", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--baseline and --reference exclude each other" in result.output


@pytest.mark.skipif(not (SHARED / "mmlu" / "test.jsonl").is_file(), reason="no shared data copy")
def test_cli_baseline_on_the_tiny_checkpoint(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from m3bench.cli.main import app
    from m3bench.runtime.tiny import write_tiny_checkpoint

    monkeypatch.setenv("M3BENCH_DATA", str(SHARED))
    tiny = write_tiny_checkpoint(tmp_path / "tiny-m3")
    common = ["accuracy", "--model", str(tiny), "--model-id", "m3bench/tiny-m3", "--task", "mmlu", "--limit", "8",
              "--no-progress", "--device", "cpu", "--dtype", "float32"]
    first = CliRunner().invoke(app, [*common, "--no-reference", "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, [*common, "--baseline", str(tmp_path / "a"), "--out", str(tmp_path / "b")])
    assert again.exit_code == 0, again.output
    summary = json.loads(next((tmp_path / "b").glob("mmlu-*.summary.json")).read_text())
    assert summary["paired"]["p_value"] == 1.0 and summary["paired"]["difference"] == 0.0
    assert "McNemar acc b=0 c=0" in again.output


def test_the_console_says_why_a_gate_could_not_fail():
    from m3bench.cli.accuracy import unfailable_line

    paired = {"task": "mmlu", "n": 3, "threshold": None, "theta": None, "paired": {"n": 3, "alpha": 0.05}}
    assert "at 3 pairs no result can fail the paired gate" in unfailable_line(paired) and "0.125" in unfailable_line(paired)
    fixed = {"task": "mmlu", "n": 1, "threshold": -35.81, "theta": 175.82}
    assert "at n=1 no score can fail this gate (threshold -35.81" in unfailable_line(fixed)
