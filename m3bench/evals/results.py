"""Per-item records (jsonl, one line per finished item, flushed as it completes) and the run summary.

    log = ItemLog(out_dir / f"{stem}.items.jsonl", run_key)
    done = log.load()            # id -> record of an earlier, interrupted run of the same key
    log.append(record)           # written and flushed at once: a killed run loses at most one line

The run key hashes everything that changes an item's outcome (model, task, protocol version, settings,
backend settings), so a rerun of the same command resumes and a changed one starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from m3bench.evals.protocols.base import Item, Judgement, Protocol
from m3bench.evals.protocols.mmlu_subjects import CATEGORY_OF
from m3bench.evals.scoring import mean_score
from m3bench.strict_json import dumps_strict

DEFAULT_OUT_DIR = Path("results")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def run_key(identity: dict[str, Any]) -> str:
    """16 hex digits naming a run: same identity, same key, same files."""
    return sha256_text(canonical_json(identity))[:16]


def prompt_sha256(item: Item) -> str:
    """Hash of what the backend is asked: prompts, chat turns, score continuations, generation settings."""
    return sha256_text(canonical_json([repr(r) for r in item.requests]))


def item_record(key: str, version: str, item: Item, raw: Any, judgement: Judgement) -> dict[str, Any]:
    return {
        "id": item.id,
        "run_key": key,
        "protocol_version": version,
        "prompt_sha256": prompt_sha256(item),
        "group": item.group,
        "raw_output": raw,
        "extracted": judgement.extracted,
        "extracted_by_metric": judgement.extracted_by_metric or None,
        "value": judgement.value,
        "correct": judgement.correct,
        "cap_hit": judgement.cap_hit,
    }


class ItemLog:
    """Append-only jsonl of finished items of one run key."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[str, Any]]:
        """Records already written for this key; a line cut short by a kill is dropped (and truncated).

        A corrupt line elsewhere is reported on stderr with its line number and removed from the file:
        its item is not done, so the run computes it again."""
        if not self.path.exists():
            return {}
        self._drop_partial_tail()
        lines = self.path.read_bytes().split(b"\n")
        done, kept, bad = {}, [], []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = parse_record(line)
            if record is None:
                bad.append(number)
                continue
            kept.append(line)
            if record["run_key"] == self.key:
                done[record["id"]] = record
        if bad:
            self._report_and_rewrite(bad, kept)
        return done

    def _report_and_rewrite(self, bad: list[int], kept: list[bytes]) -> None:
        shown = ", ".join(str(n) for n in bad[:10]) + (" ..." if len(bad) > 10 else "")
        print(f"m3bench: {self.path}: {len(bad)} corrupt line(s) (line {shown}) dropped; their items are "
              "computed again", file=sys.stderr)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, self.path)

    def _drop_partial_tail(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(dumps_strict(record, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return record


def parse_record(line: bytes) -> dict[str, Any] | None:
    """One journal line as a record (an object with a string id and run_key), None when it is not one."""
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("id"), str) and isinstance(record.get("run_key"), str)
    return record if ok else None


def file_sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@dataclass(frozen=True)
class RunPaths:
    items: Path
    summary: Path

    @classmethod
    def of(cls, out_dir: Path, task: str, key: str) -> "RunPaths":
        stem = f"{task}-{key}"
        return cls(Path(out_dir) / f"{stem}.items.jsonl", Path(out_dir) / f"{stem}.summary.json")


def write_summary(path: Path, summary: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dumps_strict(summary, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def ordered_records(items: Sequence[Item], done: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [done[item.id] for item in items]


def _grouped(records: Sequence[dict[str, Any]], key) -> dict[str, dict[str, float | int]]:
    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r["value"])
    return {g: mean_score(v).to_dict() for g, v in sorted(groups.items())}


def score_records(protocol: Protocol, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Score, per-metric scores, MMLU subject / category breakdowns and the cap-hit count of a run."""
    out: dict[str, Any] = {
        **mean_score([r["value"] for r in records]).to_dict(),
        "metrics": {m: mean_score([float(r["correct"][m]) for r in records]).to_dict() for m in protocol.metrics},
        "cap_hit": sum(bool(r["cap_hit"]) for r in records),
    }
    if records and records[0].get("group") is not None:
        out["subjects"] = _grouped(records, lambda r: r["group"])
        out["categories"] = _grouped(records, lambda r: CATEGORY_OF[r["group"]].value)
    return out
