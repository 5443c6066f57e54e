"""Bad input becomes one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2


from m3bench.runtime.errors import InputError


class M3BenchError(InputError):
    """An error the user can fix: reported as one line, exit code 2."""


def fail(message: str) -> None:
    """Print `m3bench: error: message` to stderr and exit 2."""
    print(f"m3bench: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def user_errors(fn: F) -> F:
    """Turn M3BenchError (and the input errors of libraries) into a one-line exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            fail(str(e))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as e:
            fail(f"{e.strerror}: {e.filename}")

    return wrapper  # type: ignore[return-value]
