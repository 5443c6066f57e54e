"""A synthetic task set rendered exactly in the GSM8K and MMLU formats (for a tiny model with real skill).

    write_task_set(Path("data/synthetic"), seed=0)      # gsm8k/{train,test}.jsonl, mmlu/{train,dev,test}.jsonl
    cached_task_set(shipped_task_set())                 # the shipped tiny model's set, under ~/.cache/m3bench
    m3bench accuracy --model tiny-skill --data-dir data/synthetic --task gsm8k --num-fewshot 0

GSM8K-format items are multi-step arithmetic word problems whose solutions use GSM8K's calculator
annotations and end in `#### N`; MMLU-format items are four-choice questions (answer index 0-3, spread
evenly over the letters) under real MMLU subject names, so every protocol, category table and sampler
of m3bench applies unchanged. Every split comes from its own seeded stream and held-out splits share no
question with the training split.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from m3bench.evals.datasets import GsmRow, MmluRow, cache_dir
from m3bench.runtime.tiny_skill import TaskSetId

NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kim", "Leo", "Mia", "Noor")
THINGS = ("apples", "pens", "books", "stamps", "shells", "cards", "coins", "marbles", "eggs", "plums")
FILES = ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "mmlu/train.jsonl", "mmlu/test.jsonl", "mmlu/dev.jsonl")


@dataclass(frozen=True)
class TaskSetSizes:
    gsm_train: int = 20000
    gsm_test: int = 400
    mmlu_train: int = 20000
    mmlu_test: int = 400
    mmlu_dev_per_subject: int = 5


def _rng(seed: int, split: str, kind: str) -> random.Random:
    return random.Random(f"m3bench-synthetic/{kind}/{split}/{seed}")


def _add_sub(r: random.Random) -> GsmRow:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(2, 30), r.randint(2, 30)
    c = r.randint(1, a + b - 1)
    s, t = a + b, a + b - c
    question = f"{name} has {a} {thing}. {name} buys {b} more and then gives away {c}. How many {thing} does {name} have now?"
    answer = (f"After buying, {name} has {a} + {b} = <<{a}+{b}={s}>>{s} {thing}.\n"
              f"After giving some away, {name} has {s} - {c} = <<{s}-{c}={t}>>{t} {thing}.\n#### {t}")
    return GsmRow(question, answer)


def _mul_add(r: random.Random) -> GsmRow:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a, b, c = r.randint(2, 9), r.randint(2, 9), r.randint(1, 20)
    p, t = a * b, a * b + c
    question = f"{name} buys {a} bags with {b} {thing} in each bag and finds {c} more {thing}. How many {thing} does {name} have?"
    answer = (f"The bags hold {a} * {b} = <<{a}*{b}={p}>>{p} {thing}.\n"
              f"With the ones found, {name} has {p} + {c} = <<{p}+{c}={t}>>{t} {thing}.\n#### {t}")
    return GsmRow(question, answer)


def _share(r: random.Random) -> GsmRow:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    friends, each, left = r.randint(2, 9), r.randint(2, 9), r.randint(0, 9)
    total = friends * each + left
    question = (f"{name} has {total} {thing} and gives {each} to each of {friends} friends. "
                f"How many {thing} are left?")
    given = friends * each
    answer = (f"{name} gives away {friends} * {each} = <<{friends}*{each}={given}>>{given} {thing}.\n"
              f"{name} has {total} - {given} = <<{total}-{given}={left}>>{left} {thing} left.\n#### {left}")
    return GsmRow(question, answer)


GSM_TEMPLATES: tuple[Callable[[random.Random], GsmRow], ...] = (_add_sub, _mul_add, _share)


def _choices(r: random.Random, right: int, spread: int) -> tuple[tuple[str, str, str, str], int]:
    """Four distinct numbers, the right one at a uniformly drawn position."""
    wrong: set[int] = set()
    while len(wrong) < 3:
        x = right + r.randint(-spread, spread)
        if x != right and x >= 0:
            wrong.add(x)
    values = sorted(wrong)
    r.shuffle(values)
    at = r.randrange(4)
    values.insert(at, right)
    return tuple(str(v) for v in values), at  # type: ignore[return-value]


def _sum_item(r: random.Random) -> MmluRow:
    a, b = r.randint(2, 60), r.randint(2, 60)
    choices, at = _choices(r, a + b, 9)
    return MmluRow("elementary_mathematics", f"What is {a} + {b}?", choices, at)


def _product_item(r: random.Random) -> MmluRow:
    a, b = r.randint(2, 12), r.randint(2, 12)
    choices, at = _choices(r, a * b, 12)
    return MmluRow("high_school_mathematics", f"What is {a} * {b}?", choices, at)


def _largest_item(r: random.Random) -> MmluRow:
    values = r.sample(range(1, 200), 4)
    at = max(range(4), key=lambda i: values[i])
    return MmluRow("college_mathematics", "Which of these numbers is the largest?", tuple(map(str, values)), at)


def _first_word_item(r: random.Random) -> MmluRow:
    words = r.sample(THINGS + tuple(n.lower() for n in NAMES), 4)
    at = min(range(4), key=lambda i: words[i])
    return MmluRow("miscellaneous", "Which word comes first in alphabetical order?", tuple(words), at)


MMLU_TEMPLATES: tuple[Callable[[random.Random], MmluRow], ...] = (_sum_item, _product_item, _largest_item,
                                                                  _first_word_item)


def _unique(make: Callable[[random.Random], object], r: random.Random, n: int, avoid: set[str]) -> list:
    """n items with questions new to `avoid` (which grows); the templates take turns."""
    out = []
    while len(out) < n:
        row = make(r)
        key = row.question + json.dumps(getattr(row, "choices", ""))
        if key not in avoid:
            avoid.add(key)
            out.append(row)
    return out


def gsm_rows(n: int, seed: int, split: str, avoid: set[str] | None = None) -> list[GsmRow]:
    r, avoid = _rng(seed, split, "gsm8k"), set() if avoid is None else avoid
    return _unique(lambda g: g.choice(GSM_TEMPLATES)(g), r, n, avoid)


def mmlu_rows(n: int, seed: int, split: str, avoid: set[str] | None = None) -> list[MmluRow]:
    r, avoid = _rng(seed, split, "mmlu"), set() if avoid is None else avoid
    rows = [row for t in MMLU_TEMPLATES for row in _unique(t, r, -(-n // len(MMLU_TEMPLATES)), avoid)]
    return sorted(rows[:n], key=lambda row: row.subject)  # MMLU order: by subject, order within kept


def _write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(row)) + "\n" for row in rows), encoding="utf-8")


def write_task_set(dest: Path, seed: int = 0, sizes: TaskSetSizes = TaskSetSizes()) -> Path:
    """The task set under dest in m3bench's --data-dir layout; held-out splits avoid the train questions."""
    dest = Path(dest)
    seen_gsm: set[str] = set()
    seen_mmlu: set[str] = set()
    _write_jsonl(dest / "gsm8k" / "train.jsonl", gsm_rows(sizes.gsm_train, seed, "train", seen_gsm))
    _write_jsonl(dest / "gsm8k" / "test.jsonl", gsm_rows(sizes.gsm_test, seed, "test", seen_gsm))
    _write_jsonl(dest / "mmlu" / "train.jsonl", mmlu_rows(sizes.mmlu_train, seed, "train", seen_mmlu))
    _write_jsonl(dest / "mmlu" / "test.jsonl", mmlu_rows(sizes.mmlu_test, seed, "test", seen_mmlu))
    dev = mmlu_rows(sizes.mmlu_dev_per_subject * len(MMLU_TEMPLATES), seed, "dev", seen_mmlu)
    _write_jsonl(dest / "mmlu" / "dev.jsonl", dev)
    return dest


def read_train_rows(dest: Path) -> tuple[list[GsmRow], list[MmluRow]]:
    """The training splits of a written task set (MMLU has no train split in m3bench's loaders)."""
    def rows(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    gsm = [GsmRow(**r) for r in rows(Path(dest) / "gsm8k" / "train.jsonl")]
    mmlu = [MmluRow(r["subject"], r["question"], tuple(r["choices"]), r["answer"])
            for r in rows(Path(dest) / "mmlu" / "train.jsonl")]
    return gsm, mmlu


def file_sha256s(dest: Path) -> dict[str, str]:
    """sha256 of every file write_task_set writes, by its path under dest."""
    return {name: hashlib.sha256((Path(dest) / name).read_bytes()).hexdigest() for name in FILES}


def cached_task_set(ident: TaskSetId, root: Path | None = None) -> Path:
    """The task set `ident` names, written once under root (default ~/.cache/m3bench/synthetic) and checked
    against its recorded sha256 (a mismatch means this generator no longer makes the set: RuntimeError)."""
    sizes = TaskSetSizes(**ident.sizes)
    tag = hashlib.sha256(json.dumps(asdict(sizes), sort_keys=True).encode()).hexdigest()[:12]
    dest = (cache_dir() / "synthetic" if root is None else Path(root)) / f"seed{ident.seed}-{tag}"
    if all((dest / name).is_file() for name in FILES):
        return dest
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    written = file_sha256s(write_task_set(tmp, ident.seed, sizes))
    wrong = sorted(k for k, v in ident.sha256.items() if written.get(k) != v)
    if wrong:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"the synthetic task set of seed {ident.seed} no longer matches its recorded sha256 "
                           f"({', '.join(wrong)}): evals/synthetic.py changed since the shipped model was trained")
    try:
        tmp.rename(dest)
    except OSError:  # another process wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
