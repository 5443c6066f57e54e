"""A gate plan (`m3bench gate PLAN.yaml`): the list of checks one CI verdict is made of.

    checks:
      - name: tiny-mmlu
        command: accuracy                  # accuracy | accept | sweep: an m3bench command
        args: {task: mmlu, limit: 57}      # its options: key -> --key value (see check_argv)
        timeout_s: 1800                    # optional; a check past it counts as an internal error

`args` is a mapping (underscores become dashes; true -> --flag, false -> --no-flag where the command has that
form (--progress/--no-progress), else left out (no_reference: false, sequential: false); a list -> a comma list,
null -> left out) or a list of command-line words passed as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from m3bench.numbers import is_number
from m3bench.runtime.errors import InputError

PLAN_KEYS = frozenset({"name", "checks"})
CHECK_KEYS = frozenset({"name", "command", "args", "timeout_s"})


class CheckCommand(str, Enum):
    ACCURACY = "accuracy"
    ACCEPT = "accept"
    SWEEP = "sweep"


@dataclass(frozen=True)
class Check:
    name: str
    command: CheckCommand
    args: tuple[str, ...]
    timeout_s: float | None = None


@dataclass(frozen=True)
class GatePlan:
    name: str
    checks: tuple[Check, ...]


def option_words(key: str, value: Any, negatable: frozenset[str] = frozenset()) -> list[str]:
    """One option of a mapping as command-line words (negatable: the command's --no- forms of its flags)."""
    flag = "--" + str(key).replace("_", "-")
    if value is None:
        return []
    if value is True:
        return [flag]
    if value is False:
        off = "--no-" + flag[2:]
        return [off] if off in negatable else []
    if isinstance(value, (list, tuple)):
        return [flag, ",".join(str(v) for v in value)]
    return [flag, str(value)]


def check_argv(where: str, name: str, args: Any, negatable: frozenset[str] = frozenset()) -> tuple[str, ...]:
    if args is None:
        return ()
    if isinstance(args, list) and all(isinstance(a, (str, int, float)) for a in args):
        return tuple(str(a) for a in args)
    if isinstance(args, dict):
        return tuple(word for key, value in args.items() for word in option_words(key, value, negatable))
    raise InputError(f"{where}: check {name!r}: args must be a mapping of options or a list of words")


def _check(where: str, index: int, raw: Any, negatable: Mapping[CheckCommand, frozenset[str]]) -> Check:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise InputError(f"{where}: check {index} needs a mapping with a name")
    name = raw["name"]
    unknown = set(raw) - CHECK_KEYS
    if unknown:
        raise InputError(f"{where}: check {name!r} has unknown keys {sorted(unknown)}")
    try:
        command = CheckCommand(raw.get("command"))
    except ValueError:
        choices = ", ".join(c.value for c in CheckCommand)
        raise InputError(f"{where}: check {name!r}: command must be one of {choices}, got {raw.get('command')!r}") from None
    timeout = raw.get("timeout_s")
    if timeout is not None and (not is_number(timeout) or timeout <= 0):
        raise InputError(f"{where}: check {name!r}: timeout_s must be a positive number")
    return Check(name, command, check_argv(where, name, raw.get("args"), negatable.get(command, frozenset())), timeout)


def load_plan(path: Path, negatable: Mapping[CheckCommand, frozenset[str]] | None = None) -> GatePlan:
    """The plan of a YAML file; InputError naming the problem when it is not one. negatable: per command, the
    --no- forms of its flags (the CLI's option table; without it a false flag is left out)."""
    import yaml

    where = str(path)
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise InputError(f"{where}: malformed YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list) or not doc["checks"]:
        raise InputError(f"{where}: a gate plan is a mapping with a non-empty list of checks")
    unknown = set(doc) - PLAN_KEYS
    if unknown:
        raise InputError(f"{where}: unknown keys {sorted(unknown)}")
    checks = tuple(_check(where, i, raw, negatable or {}) for i, raw in enumerate(doc["checks"]))
    names = [c.name for c in checks]
    if len(set(names)) != len(names):
        raise InputError(f"{where}: check names must be unique, got {names}")
    return GatePlan(str(doc.get("name") or Path(path).stem), checks)
