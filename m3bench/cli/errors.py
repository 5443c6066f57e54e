"""Bad input becomes one line on stderr and exit code 2; an internal error one line, exit 3 and a log file.

Every command runs under `GuardedGroup` (the root Typer's click group), so no traceback reaches the user:
InputError -> `m3bench: error: ...`, exit 2; any other exception -> `m3bench: internal error: ...
(traceback in LOG)`, exit 3; Ctrl-C -> exit 130.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable, TypeVar

import typer
from typer.core import TyperGroup

from m3bench.runtime.errors import InputError

F = TypeVar("F", bound=Callable)

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
LOG_DIR_ENV = "M3BENCH_LOG_DIR"
PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


class M3BenchError(InputError):
    """An error the user can fix: reported as one line, exit code 2."""


def fail(message: str) -> None:
    """Print `m3bench: error: message` to stderr and exit 2."""
    print(f"m3bench: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def one_line(message: str, limit: int = 500) -> str:
    """The message on one line (newlines folded), cut at `limit` characters."""
    text = " ".join(str(message).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def user_errors(fn: F) -> F:
    """Turn M3BenchError (and the input errors of libraries) into a one-line exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            fail(str(e))
        except PATH_ERRORS as e:
            fail(f"{e.strerror}: {e.filename}")

    return wrapper  # type: ignore[return-value]


def log_dir() -> Path:
    """$M3BENCH_LOG_DIR, else ~/.cache/m3bench/logs (or $M3BENCH_CACHE/logs)."""
    if os.environ.get(LOG_DIR_ENV):
        return Path(os.environ[LOG_DIR_ENV])
    from m3bench.evals.datasets import cache_dir

    return cache_dir() / "logs"


def write_crash_log(exc: BaseException) -> Path:
    """The traceback of `exc` in a fresh file under log_dir() (the temp dir if that is not writable)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    text = f"m3bench {' '.join(sys.argv[1:])}\n" + "".join(traceback.format_exception(exc))
    for base in (log_dir(), Path(tempfile.gettempdir())):
        path = base / f"crash-{stamp}-{os.getpid()}.log"
        try:
            base.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    return Path("<no writable log dir>")


def internal_error(exc: BaseException) -> None:
    """One line naming the error and the log holding its traceback; exit 3."""
    path = write_crash_log(exc)
    name = type(exc).__name__
    print(f"m3bench: internal error: {name}: {one_line(str(exc), 200)} (traceback in {path})", file=sys.stderr)
    raise SystemExit(EXIT_INTERNAL)


PASS_THROUGH = (typer.TyperException, typer.Exit, typer.Abort, SystemExit)  # usage errors, --help, exits


class GuardedGroup(TyperGroup):
    """The root click group: every command's exceptions end as exit 2 (input), 3 (internal) or 130 (Ctrl-C)."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except PASS_THROUGH:
            raise
        except KeyboardInterrupt:
            print("m3bench: interrupted", file=sys.stderr)
            raise SystemExit(EXIT_INTERRUPTED) from None
        except InputError as e:
            fail(str(e))
        except PATH_ERRORS as e:  # a path the user gave (as in user_errors)
            fail(f"{e.strerror}: {e.filename}")
        except Exception as e:  # noqa: BLE001 - the one place internal errors are turned into exit 3
            internal_error(e)
