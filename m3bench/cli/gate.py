"""`m3bench gate PLAN.yaml`: run a plan's checks (accuracy, accept, sweep) and give one verdict.

    m3bench gate ci/gate.yaml --junit results/gate.xml --markdown results/gate.md

Each check runs as its own `m3bench` process (its output in LOG_DIR/<check>.log). The verdict is a table
on stderr, JUnit XML (--junit), Markdown (--markdown FILE, and appended to $GITHUB_STEP_SUMMARY when that
is set), and the exit code of the worst check: 3 internal error > 2 bad input > 1 regression > 0 pass
(an errored check gave no verdict at all, which is worse than a measured regression). A malformed plan
is exit 2 before anything runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli.errors import user_errors

HELP = {
    "plan": "Gate plan YAML: checks, each an m3bench command (accuracy, accept, sweep) and its options.",
    "junit": "Write one JUnit test case per check.",
    "markdown": "Write the verdict as Markdown (also appended to $GITHUB_STEP_SUMMARY when set).",
    "log_dir": "Directory of the checks' logs (stdout and stderr of each).",
}


def register(app: typer.Typer) -> None:
    @app.command("gate")
    def gate(
        ctx: typer.Context,
        plan: Path = typer.Argument(..., help=HELP["plan"]),
        junit: Optional[Path] = typer.Option(None, "--junit", help=HELP["junit"]),
        markdown: Optional[Path] = typer.Option(None, "--markdown", help=HELP["markdown"]),
        log_dir: Path = typer.Option(Path("results/gate-logs"), "--log-dir", help=HELP["log_dir"]),
    ) -> None:
        """Run a gate plan's checks; one verdict (table, JUnit, Markdown); exit code of the worst check."""
        raise typer.Exit(_run(plan, junit, markdown, log_dir, negatable_flags(ctx.find_root().command)))


def negatable_flags(root) -> dict:
    """Per check command, the --no- forms of its options (--progress/--no-progress: '--no-progress'), from the
    app's own option table: a plan's `flag: false` becomes that form, or is left out where there is none."""
    from m3bench.evals.gate_plan import CheckCommand

    return {c: frozenset(o for p in root.commands[c.value].params for o in getattr(p, "secondary_opts", ()))
            for c in CheckCommand}


@user_errors
def _run(plan_path: Path, junit: Path | None, markdown: Path | None, log_dir: Path, negatable: dict) -> int:
    from m3bench.evals.gate_plan import load_plan
    from m3bench.evals.gate_run import run_check, worst_exit

    plan = load_plan(plan_path, negatable)
    results = [run_check(check, log_dir) for check in plan.checks]
    code = worst_exit(results)
    print_table(plan.name, results, code)
    if junit is not None:
        write_gate_junit(junit, plan.name, results)
    text = markdown_report(plan.name, results, code)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text, encoding="utf-8")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(text)
    return code


def verdict_word(code: int) -> str:
    from m3bench.evals.gate_run import STATUS

    return STATUS[code].upper()


def print_table(name: str, results: list, code: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gate {name}: {verdict_word(code)} (exit {code})")
    for col in ("check", "command", "status", "exit", "detail", "wall s", "log"):
        table.add_column(col)
    for r in results:
        table.add_row(r.name, r.command, r.status, str(r.exit_code), r.detail, f"{r.wall_s:.1f}", str(r.log))
    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=200)
    console.print(table)


def markdown_report(name: str, results: list, code: int) -> str:
    rows = "".join(f"| {r.name} | `{r.command}` | {r.status} | {r.exit_code} | {_cell(r.detail)} | {r.wall_s:.1f} |\n"
                   for r in results)
    return (f"## m3bench gate `{name}`: {verdict_word(code)} (exit {code})\n\n"
            "| check | command | status | exit | detail | wall s |\n|---|---|---|---|---|---|\n" + rows + "\n")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_gate_junit(path: Path, name: str, results: list) -> Path:
    from m3bench.junit import JUnitCase, write_junit

    cases = []
    for r in results:
        cls, line = f"m3bench.gate.{name}", f"{r.command}: {r.detail} (log {r.log})"
        if r.exit_code == 0:
            cases.append(JUnitCase(cls, r.name, line))
        else:
            kind = {1: "Regression", 2: "BadInput", 3: "InternalError"}[r.exit_code]
            cases.append(JUnitCase(cls, r.name, line, failure=f"{r.status}: {r.detail}", failure_type=kind))
    return write_junit(path, f"m3bench.gate.{name}", cases)
