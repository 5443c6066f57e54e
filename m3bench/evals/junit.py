"""JUnit XML of accuracy verdicts, one test case per task (CI systems render these natively)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from m3bench.evals.scoring import plus_minus
from m3bench.junit import JUnitCase
from m3bench.junit import write_junit as write_cases


def _case(summary: dict[str, Any], model_id: str) -> JUnitCase:
    threshold = summary.get("threshold")
    line = f"{summary['task']} ({summary['protocol']}): {summary['score']:.2f} on n={summary['n']}"
    cls, name = f"m3bench.accuracy.{model_id}", summary["task"]
    if summary.get("paired"):
        return _paired_case(summary, cls, name, line)
    if summary["verdict"] == "fail":
        ceiling = summary.get("ceiling")
        why = f"> ceiling {ceiling:.2f}" if ceiling is not None and summary["score"] > ceiling else f"< threshold {threshold:.2f}"
        return JUnitCase(cls, name, f"reference {summary['reference']}\ntheta {summary['theta']:.2f}",
                         failure=f"{line} {why}", failure_type="AccuracyRegression")
    if summary["verdict"] == "no_reference":
        return JUnitCase(cls, name, skipped=f"{line}; not gated (--no-reference)")
    unfailable = "; no score can fail the gate at this n (run more items)" if summary.get("gate_can_fail") is False else ""
    return JUnitCase(cls, name, f"{line} >= threshold {threshold:.2f}{unfailable}")


def _paired_case(summary: dict[str, Any], cls: str, name: str, line: str) -> JUnitCase:
    p = summary["paired"]
    detail = (f"{line}; vs baseline {summary['baseline']['run_key']}: difference {p['difference']:+.2f} "
              f"{plus_minus(p['stderr'])}, McNemar p={p['p_value']:.4g}")
    if summary["verdict"] == "fail":
        return JUnitCase(cls, name, detail, failure=f"{detail} < alpha {p['alpha']}", failure_type="AccuracyRegression")
    unfailable = "; no result can fail the gate at this n (run more items)" if summary.get("gate_can_fail") is False else ""
    return JUnitCase(cls, name, detail + unfailable)


def write_junit(path: Path, summaries: Sequence[dict[str, Any]], model_id: str) -> Path:
    return write_cases(path, "m3bench.accuracy", [_case(s, model_id) for s in summaries])
