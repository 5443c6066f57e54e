"""The m3bench Typer app: assembles one module per command (each exposes `register(app)`).

    m3bench --help
    m3bench generate --model DIR --prompt "Hello"
"""

from __future__ import annotations

import importlib

import typer

from m3bench import __version__
from m3bench.cli.errors import GuardedGroup

COMMAND_MODULES = (
    "m3bench.cli.generate",
    "m3bench.cli.checkpoint",
    "m3bench.cli.accuracy",
    "m3bench.cli.accept",
    "m3bench.cli.lm_eval",
    "m3bench.cli.serve",
    "m3bench.cli.sweep",
    "m3bench.cli.gate",
)

app = typer.Typer(
    name="m3bench",
    help="Benchmarking and accuracy toolkit for MiniMax-M3 (accuracy, acceptance, Pareto sweeps, CI gates).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=GuardedGroup,  # no traceback reaches the user: exit 2 (input) or 3 (internal, log file)
    rich_markup_mode=None,  # help text shows as written: `[r L, L]` is text, not markup
)


def _version(value: bool) -> None:
    if value:
        print(f"m3bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """m3bench: is this MiniMax-M3 build accurate, does Eagle3 accept, where is it on the Pareto frontier."""


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # command not built yet in this tree
                continue
            raise
        module.register(app)


_register_all()


def run() -> None:
    app()
