"""Paired comparison of two runs on the same items (`m3bench accuracy --baseline RUN`).

    result = paired_test(current_records, baseline_records, metric="acc", alpha=0.05)
    result.verdict, result.p_value, result.difference, result.stderr

Items are paired by id and must be the same items (same prompt hash). On the right / wrong outcome of the
protocol's primary metric, McNemar's exact test counts the discordant pairs: b = right in the baseline and
wrong now, c = wrong in the baseline and right now; under "no change" b ~ Binomial(b + c, 1/2). The
one-sided p-value P(X >= b) tests for a regression; the verdict fails when p < alpha. The paired
difference of the item scores (current - baseline, 0-100) and its standard error sd(d) / sqrt(n) are
reported beside it (GSM8K's item score is the mean of its two metrics).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from m3bench.evals.gate import DEFAULT_ALPHA, Verdict
from m3bench.evals.results import ItemLog
from m3bench.evals.scoring import mean_score
from m3bench.runtime.errors import InputError


@dataclass(frozen=True)
class PairedResult:
    n: int
    metric: str
    baseline_only_right: int  # b: right in the baseline, wrong now
    current_only_right: int  # c: wrong in the baseline, right now
    difference: float  # mean of current - baseline item scores, 0-100
    stderr: float  # standard error of that mean, 0-100
    p_value: float  # one-sided exact McNemar: P(X >= b), X ~ Binomial(b + c, 1/2)
    p_value_two_sided: float
    alpha: float
    verdict: Verdict

    @property
    def can_fail(self) -> bool:
        """Whether some outcome of n pairs fails: at n <= 4 pairs no result reaches alpha 0.05."""
        return smallest_p_value(self.n) < self.alpha

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict.value}


def smallest_p_value(n: int) -> float:
    """The smallest one-sided McNemar p of n pairs: 0.5^n, every pair right before and wrong now."""
    return 0.5**n


def binomial_upper_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exact (integer arithmetic)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def mcnemar_exact(b: int, c: int) -> tuple[float, float]:
    """(one-sided p of b being this large, two-sided p) of McNemar's exact test."""
    n = b + c
    upper = binomial_upper_tail(b, n)
    lower = binomial_upper_tail(c, n)  # P(X <= b) = P(X >= c) by symmetry
    return upper, min(1.0, 2.0 * min(upper, lower))


def paired_difference(current: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """(mean difference, its standard error) of paired item scores, both 0-100."""
    score = mean_score([a - b for a, b in zip(current, baseline, strict=True)])  # one definition of mean and SE
    return score.value, score.stderr


def pair_records(current: Sequence[dict[str, Any]], baseline: dict[str, dict[str, Any]]) -> list[tuple[dict, dict]]:
    """(current, baseline) record pairs by item id; InputError when an item is missing or differs."""
    missing = [r["id"] for r in current if r["id"] not in baseline]
    if missing:
        raise InputError(f"the baseline has no record of {len(missing)} of {len(current)} items (e.g. {missing[0]}): "
                         "a paired comparison needs the same items")
    changed = [r["id"] for r in current if r.get("prompt_sha256") != baseline[r["id"]].get("prompt_sha256")]
    if changed:
        raise InputError(f"{len(changed)} items were asked differently in the baseline (e.g. {changed[0]}): "
                         "a paired comparison needs the same prompts")
    return [(r, baseline[r["id"]]) for r in current]


def paired_test(current: Sequence[dict[str, Any]], baseline: dict[str, dict[str, Any]], metric: str,
                alpha: float = DEFAULT_ALPHA) -> PairedResult:
    """McNemar's exact test on `metric`'s right / wrong and the paired score difference, current vs baseline."""
    pairs = pair_records(current, baseline)
    if not pairs:
        raise InputError("a paired comparison needs at least one item")
    now = [bool(c["correct"][metric]) for c, _ in pairs]
    before = [bool(b["correct"][metric]) for _, b in pairs]
    b = sum(x and not y for x, y in zip(before, now))
    c = sum(y and not x for x, y in zip(before, now))
    p_one, p_two = mcnemar_exact(b, c)
    diff, se = paired_difference([c_["value"] for c_, _ in pairs], [b_["value"] for _, b_ in pairs])
    verdict = Verdict.FAIL if p_one < alpha else Verdict.PASS
    return PairedResult(len(pairs), metric, b, c, diff, se, p_one, p_two, alpha, verdict)


@dataclass(frozen=True)
class Baseline:
    summary_path: Path
    summary: dict[str, Any]
    records: dict[str, dict[str, Any]]  # item id -> record of the baseline run

    def describe(self) -> dict[str, Any]:
        s = self.summary
        return {"summary": str(self.summary_path), "run_key": s.get("run_key"), "score": s.get("score"), "n": s.get("n")}


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"--baseline {path}: not a readable summary JSON ({e})") from e
    if not isinstance(summary, dict) or not {"task", "run_key", "items_path"} <= set(summary):
        raise InputError(f"--baseline {path}: not an accuracy summary (needs task, run_key, items_path)")
    return summary


def _same_run_kind(summary: dict[str, Any], task: str, protocol_version: str, settings: dict[str, Any]) -> bool:
    meta = summary.get("metadata") or {}
    return (summary.get("task") == task and summary.get("protocol_version") == protocol_version
            and meta.get("settings") == settings)


def find_baseline(path: Path, task: str, protocol_version: str, settings: dict[str, Any]) -> Baseline:
    """The baseline run of `task`: a summary file, or the one summary of a results directory with this task,
    protocol version and settings; its item records from the journal it names (that run key only)."""
    path = Path(path)
    if path.is_dir():
        found = [p for p in sorted(path.glob(f"{task}-*.summary.json"))
                 if _same_run_kind(_read_summary(p), task, protocol_version, settings)]
        if len(found) != 1:
            raise InputError(f"--baseline {path}: {len(found)} {task} summaries with protocol {protocol_version} and "
                             f"these settings (need exactly one; pass the summary file)")
        path = found[0]
    elif not path.is_file():
        raise InputError(f"--baseline {path}: no such file or directory")
    summary = _read_summary(path)
    if summary["task"] != task or summary.get("protocol_version") != protocol_version:
        raise InputError(f"--baseline {path}: a {summary['task']} run ({summary.get('protocol_version')}), "
                         f"not {task} ({protocol_version})")
    items = Path(summary["items_path"])
    if not items.is_file():
        items = path.parent / items.name  # the results directory was moved or the path was relative
    if not items.is_file():
        raise InputError(f"--baseline {path}: its item journal {summary['items_path']} is missing")
    return Baseline(path, summary, ItemLog(items, summary["run_key"]).load())
