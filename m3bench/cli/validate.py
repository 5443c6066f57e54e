"""Checks of command-line inputs made before any work starts (each raises M3BenchError: one line, exit 2).

    out_directory(opts.out, "--out")          # an existing file, or a directory that cannot be made, is refused
    output_file(opts.junit, "--junit")        # a directory, or a file in a missing unmakeable folder, is refused
    text_file(opts.reference, "--reference")  # must exist and be UTF-8
    context_fits(prompt_len, max_tokens, max_model_len)
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

from m3bench.cli.errors import M3BenchError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _creatable(path: Path, flag: str) -> None:
    """`path` can be made: its nearest existing ancestor is a writable directory."""
    base = _first_existing(path.absolute().parent)
    if not base.is_dir():
        raise M3BenchError(f"{flag} {path}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise M3BenchError(f"{flag} {path}: {base} is not writable")


def out_directory(path: Path, flag: str = "--out") -> Path:
    """An output directory: existing and writable, or makeable."""
    if path.exists() and not path.is_dir():
        raise M3BenchError(f"{flag} {path} exists and is not a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise M3BenchError(f"{flag} {path} is not writable")
        return path
    _creatable(path, flag)
    return path


def output_file(path: Path, flag: str) -> Path:
    """A file to write: not a directory; an existing one must be writable, a new one makeable."""
    if path.is_dir():
        raise M3BenchError(f"{flag} {path} is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise M3BenchError(f"{flag} {path} is not writable")
    if not path.exists():
        _creatable(path, flag)
    return path


def text_file(path: Path, flag: str) -> str:
    """The UTF-8 text of an input file that must exist."""
    if not path.exists():
        raise M3BenchError(f"{flag} {path} does not exist")
    if not path.is_file():
        raise M3BenchError(f"{flag} {path} is not a file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise M3BenchError(f"{flag} {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise M3BenchError(f"{flag} {path}: {e.strerror}") from None


def finite(value: float | None, flag: str) -> None:
    if value is not None and not math.isfinite(value):
        raise M3BenchError(f"{flag} must be a finite number, got {value}")


def log_level(value: str) -> str:
    if value.lower() not in LOG_LEVELS:
        raise M3BenchError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.lower()


def bind_address(host: str, port: int) -> None:
    """`host:port` resolves and can be bound now (checked before the model loads)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as e:
        raise M3BenchError(f"--host {host!r} is not an address this machine can bind ({e})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise M3BenchError(f"cannot bind {host}:{port}: {e.strerror}") from None


def run_paths(out: Path, junit: Path | None, reference: Path | None, no_reference: bool, data_dir: Path | None) -> None:
    """The paths of a gated evaluation run (accuracy, accept): checked before any model loads."""
    from m3bench.evals.datasets import check_data_dir, resolve_data_dir

    if reference is not None and no_reference:
        raise M3BenchError("--reference and --no-reference contradict each other: give one")
    if reference is not None:
        text_file(reference, "--reference")
    out_directory(out, "--out")
    if junit is not None:
        output_file(junit, "--junit")
    named = resolve_data_dir(data_dir)
    if named is not None:
        check_data_dir(named)


def context_fits(prompt_len: int, max_tokens: int, max_model_len: int, what: str = "prompt") -> None:
    """The prompt plus the tokens asked for fit the model's context."""
    if prompt_len + max_tokens > max_model_len:
        raise M3BenchError(f"{what} of {prompt_len} tokens + --max-tokens {max_tokens} exceeds the context of "
                           f"{max_model_len} tokens")
