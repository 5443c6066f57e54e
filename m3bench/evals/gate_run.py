"""Running a gate plan's checks: each an `m3bench` command in its own process, its output kept in a log.

    results = [run_check(check, log_dir) for check in plan.checks]
    worst_exit(results)           # the plan's exit code

Exit codes order as 3 (internal error) > 2 (bad input) > 1 (regression) > 0 (pass): a check that ended in
an error produced no verdict at all, so nothing can be said about what it was to guard; that is worse
than a measured regression, which is at least a verdict. A code outside 0-3 (a signal) counts as 3.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from m3bench.evals.gate_plan import Check, CheckCommand

EXIT_INTERNAL = 3
STATUS = {0: "pass", 1: "regression", 2: "bad input", 3: "internal error"}


@dataclass(frozen=True)
class CheckResult:
    name: str
    command: str
    exit_code: int
    detail: str
    log: Path
    wall_s: float

    @property
    def status(self) -> str:
        return STATUS[self.exit_code]


def worst_exit(results: list[CheckResult]) -> int:
    return max((r.exit_code for r in results), default=0)


def check_command(check: Check) -> list[str]:
    argv = [sys.executable, "-m", "m3bench", check.command.value, *check.args]
    quiet = check.command in (CheckCommand.ACCURACY, CheckCommand.ACCEPT)
    if quiet and not {"--progress", "--no-progress"} & set(check.args):
        argv.append("--no-progress")
    return argv


def run_check(check: Check, log_dir: Path) -> CheckResult:
    """Run one check to its end (or its timeout); its exit code, a one-line detail and its log."""
    argv = check_command(check)
    log = Path(log_dir) / (re.sub(r"[^A-Za-z0-9_.-]", "_", check.name) + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=check.timeout_s)
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        out, err, code = _text(e.stdout), _text(e.stderr) + f"\ntimed out after {check.timeout_s} s", EXIT_INTERNAL
    wall = time.monotonic() - start
    log.write_text(f"$ {' '.join(argv)}\n--- exit {code}\n--- stdout\n{out}\n--- stderr\n{err}\n", encoding="utf-8")
    code = code if code in STATUS else EXIT_INTERNAL
    return CheckResult(check.name, check.command.value, code, describe(check.command, code, out, err), log, wall)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def describe(command: CheckCommand, code: int, stdout: str, stderr: str) -> str:
    """The check's figures in one line (the error line when it produced none)."""
    try:
        if code in (0, 1) and command is CheckCommand.ACCURACY:
            return "; ".join(_accuracy_line(Path(p)) for p in stdout.split() if p.endswith(".summary.json"))
        if code in (0, 1) and command is CheckCommand.ACCEPT:
            s = json.loads(stdout)
            return f"AL {s['acceptance_length']:.3f} (min_al {s['min_al']}), n={s['n']}: {s['verdict']}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _accuracy_line(path: Path) -> str:
    s = json.loads(path.read_text(encoding="utf-8"))
    unfailable = " (no score could fail at this n)" if s.get("gate_can_fail") is False else ""
    return f"{s['task']} {s['score']:.2f} (n={s['n']}): {s['verdict']}{unfailable}"
