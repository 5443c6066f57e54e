"""Checks of programmatic dependent launch (kernels/pdl_triton.py) on what sm90_compile.py records and builds.

The static race check, on a kernel's PTX: `griddepcontrol.wait` comes before every instruction that can touch
global memory, unpredicated and in the entry block (no label or branch before it), so every path through the
kernel passes the wait first.

    wait_problems(ptx)             -> [] when the wait comes first, else what comes before it (or that it is missing)
    trigger_side(ptx)              -> "before" / "after" the wait: where griddepcontrol.launch_dependents sits
    has_gdc(ptx)                   -> any griddepcontrol instruction at all (a PDL-off variant has none)
    opcode_counts(ptx)             -> the entry function's opcodes and their counts, griddepcontrol left out (a PDL
                                      twin with the same counts as its PDL-off variant does the same arithmetic,
                                      only scheduled around the wait)
    flag_problems(launches, code)  -> launches whose PDL / launch_pdl keywords do not match the mode's code

Pure Python, no triton import: test_pdl.py checks these on hand-written inputs.
"""

from __future__ import annotations

import re
from collections import Counter

WAIT = "griddepcontrol.wait"
TRIGGER = "griddepcontrol.launch_dependents"
MEMORY_OPS = {"ld", "ldu", "st", "atom", "red", "prefetch", "prefetchu", "cp", "multimem"}
OTHER_SPACES = ("param", "shared", "local", "const")  # state spaces that are not global memory
BRANCHES = {"bra", "brx", "call", "ret", "exit", "trap"}
_PREDICATE = re.compile(r"^@!?%\w+\s+")


def entry_statements(ptx: str) -> list[str]:
    """The .entry function's statements and basic-block labels in order (comments, directives, braces dropped)."""
    start = ptx.index(".entry")
    end = ptx.find("$L__func_end", start)
    body = ptx[ptx.index("{", start) + 1:end if end >= 0 else None]
    if end < 0:  # no line info: the function's own closing brace, at column 0
        body = re.split(r"^\}\s*$", body, maxsplit=1, flags=re.MULTILINE)[0]
    out = []
    for raw in body.splitlines():
        for stmt in raw.split("//")[0].split(";"):
            stmt = stmt.strip()
            if stmt and not stmt.startswith(".") and stmt not in ("{", "}"):
                out.append(stmt)
    return out


def opcode(stmt: str) -> str:
    """The instruction's opcode, its predicate (@%p / @!%p) dropped."""
    return _PREDICATE.sub("", stmt).split()[0]


def touches_global(op: str) -> bool:
    """Whether an opcode may access global memory: it names the global space, or (ld / st / atom ...) names none
    (a generic address may be global). cp.async's commit / wait steps name no space and access nothing."""
    parts = op.split(".")
    if parts[0] not in MEMORY_OPS:
        return False
    if "global" in parts or parts[0] == "multimem":
        return True
    if parts[0] == "cp":
        return False
    return not any(p.startswith(OTHER_SPACES) for p in parts[1:])


def _is_block_label(stmt: str) -> bool:
    """A basic block's label ($L__BB0_3:); the line-info labels ($L__tmp0:, $L__func_begin0:) are not blocks."""
    return stmt.endswith(":") and stmt.startswith("$L__BB")


def wait_problems(ptx: str) -> list[str]:
    """Why the first griddepcontrol.wait does not come first ([] when it does)."""
    stmts = entry_statements(ptx)
    waits = [i for i, s in enumerate(stmts) if opcode(s) == WAIT]
    if not waits:
        return ["no griddepcontrol.wait"]
    first = waits[0]
    problems = [f"the wait is predicated: {stmts[first]!r}"] if _PREDICATE.match(stmts[first]) else []
    for s in stmts[:first]:
        if _is_block_label(s):
            problems.append(f"a block label before the wait: {s!r}")
        elif not s.endswith(":") and opcode(s) in BRANCHES:
            problems.append(f"a branch before the wait: {s!r}")
        elif not s.endswith(":") and touches_global(opcode(s)):
            problems.append(f"a global access before the wait: {s!r}")
    return problems


def trigger_side(ptx: str) -> str | None:
    """Where the first launch_dependents sits relative to the first wait: "before", "after", or None."""
    ops = [opcode(s) for s in entry_statements(ptx) if not s.endswith(":")]
    if TRIGGER not in ops:
        return None
    if WAIT not in ops:
        return "before"
    return "before" if ops.index(TRIGGER) < ops.index(WAIT) else "after"


def has_gdc(ptx: str) -> bool:
    return "griddepcontrol" in ptx


def opcode_counts(ptx: str) -> Counter:
    return Counter(op for op in (opcode(s) for s in entry_statements(ptx) if not s.endswith(":"))
                   if not op.startswith("griddepcontrol"))


def flag_problems(launches, code: int) -> list[str]:
    """launches: (kernel name, its parameter names, launch keywords) under a mode of PDL code `code`. Every kernel
    has a PDL parameter and every launch passes PDL == code, with launch_pdl exactly when code != 0 (launched
    early without waiting, a kernel would race; waiting without launch_pdl, it only loses the overlap)."""
    want = (code, code != 0)
    problems = []
    for name, params, kwargs in launches:
        got = (kwargs.get("PDL"), kwargs.get("launch_pdl", False))
        if "PDL" not in params:
            problems.append(f"{name}: no PDL parameter")
        elif got != want:
            problems.append(f"{name}: (PDL, launch_pdl) {got}, want {want}")
    return sorted(set(problems))
