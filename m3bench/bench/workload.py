"""Benchmark prompts: random token ids of exact lengths, GSM8K questions, or any jsonl.

    prompts = random_prompts(tokenizer, isl=1024, osl=256, num=40, lengths=LengthRange(RangeKind.INFERENCEX), seed=0)
    prompts[0].token_ids, prompts[0].text, prompts[0].output_len

Random prompts are token ids chosen so that `encode(decode(ids)) == ids` (a fixed point of the
tokenizer, no special tokens): a target fed the text sees exactly as many tokens as one fed the
ids. Lengths (input and output alike) are drawn uniformly, integers inclusive, from
- RangeKind.INFERENCEX: [r L, L], r = range_ratio (default 0.8; InferenceX / vLLM before 0.9),
- RangeKind.VLLM: [floor(L (1 - r)), ceil(L (1 + r))], r default 0 (vLLM's random dataset today).
Every request is sent with ignore_eos, so output lengths are what was asked.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from m3bench.runtime.errors import InputError

MAX_ROUND_TRIPS = 16
MAX_REDRAWS = 8


class RangeKind(str, Enum):
    INFERENCEX = "inferencex"
    VLLM = "vllm"


class DatasetKind(str, Enum):
    RANDOM = "random"
    GSM8K = "gsm8k"
    JSONL = "jsonl"
    TRACE = "trace"  # a Mooncake / AIPerf mooncake_trace file (bench/trace.py)


DEFAULT_RATIO = {RangeKind.INFERENCEX: 0.8, RangeKind.VLLM: 0.0}


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class WorkloadPrompt:
    token_ids: tuple[int, ...]
    text: str
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class LengthRange:
    kind: RangeKind = RangeKind.INFERENCEX
    range_ratio: float | None = None  # None: the kind's default

    def bounds(self, length: int) -> tuple[int, int]:
        """Inclusive [low, high] for a nominal length L (low >= 1)."""
        r = DEFAULT_RATIO[self.kind] if self.range_ratio is None else self.range_ratio
        if self.kind is RangeKind.INFERENCEX:
            if not 0.0 < r <= 1.0:
                raise InputError(f"--range-ratio for inferencex lengths [r L, L] must be in (0, 1], got {r}")
            return max(1, int(math.ceil(r * length))), length
        if not 0.0 <= r < 1.0:
            raise InputError(f"--range-ratio for vllm lengths [L(1-r), L(1+r)] must be in [0, 1), got {r}")
        return max(1, int(math.floor(length * (1 - r)))), int(math.ceil(length * (1 + r)))

    def draw(self, length: int, num: int, rng: np.random.Generator) -> list[int]:
        low, high = self.bounds(length)
        return [int(n) for n in rng.integers(low, high + 1, size=num)]


def random_prompts(
    tokenizer: Tokenizer, isl: int, osl: int, num: int, lengths: LengthRange = LengthRange(), seed: int = 0
) -> list[WorkloadPrompt]:
    """`num` random prompts of exact token lengths (drawn per `lengths`), output lengths likewise."""
    if isl < 1 or osl < 1 or num < 1:
        raise InputError(f"isl, osl and the number of prompts must be >= 1 (got {isl}, {osl}, {num})")
    rng = np.random.default_rng(seed)
    vocab = plain_vocab(tokenizer)
    in_lens, out_lens = lengths.draw(isl, num, rng), lengths.draw(osl, num, rng)
    ids = stable_token_ids(tokenizer, in_lens, vocab, rng)
    texts = tokenizer.batch_decode(ids)
    return [WorkloadPrompt(tuple(i), t, n_out) for i, t, n_out in zip(ids, texts, out_lens)]


def plain_vocab(tokenizer: Tokenizer) -> np.ndarray:
    """Every id but the special ones (BOS, EOS, chat markers, added tokens)."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    vocab = np.array([i for i in range(size) if i not in special], dtype=np.int64)
    if vocab.size == 0:
        raise InputError("the tokenizer has no ordinary tokens to draw prompts from")
    return vocab


def stable_token_ids(tokenizer: Tokenizer, lens: Sequence[int], vocab: np.ndarray,
                     rng: np.random.Generator) -> list[list[int]]:
    """For each n in lens, n ids with encode(decode(ids)) == ids: re-encode, trim or top up, repeat.

    All prompts go through the tokenizer together (one batched encode per round trip)."""
    draw = lambda k: [int(i) for i in rng.choice(vocab, size=k)]  # noqa: E731
    ids = [draw(n) for n in lens]
    done: list[list[int] | None] = [None] * len(lens)
    for attempt in range(MAX_ROUND_TRIPS * MAX_REDRAWS):
        todo = [i for i, d in enumerate(done) if d is None]
        if not todo:
            return done  # type: ignore[return-value]
        again = tokenizer(tokenizer.batch_decode([ids[i] for i in todo]), add_special_tokens=False)["input_ids"]
        for i, enc in zip(todo, again):
            n = lens[i]
            if list(enc) == ids[i]:
                done[i] = ids[i]
            elif (attempt + 1) % MAX_ROUND_TRIPS == 0:
                ids[i] = draw(n)  # stuck in a cycle: start this one afresh
            else:
                ids[i] = list(enc[:n]) + draw(max(0, n - len(enc)))
    raise InputError(f"could not draw token ids that survive a decode/encode round trip (lengths {sorted(set(lens))[:5]})")


def dataset_prompts(
    tokenizer: Tokenizer, kind: DatasetKind, osl: int, num: int, path: Path | None = None, seed: int = 0
) -> list[WorkloadPrompt]:
    """`num` prompts from GSM8K test questions or a jsonl file, sampled with a local generator."""
    texts = _gsm8k_texts() if kind is DatasetKind.GSM8K else _jsonl_texts(path)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    picked = [texts[order[i % len(texts)]] for i in range(num)]  # cycles when the file is short
    return [WorkloadPrompt(tuple(tokenizer.encode(t, add_special_tokens=False)), t, osl) for t in picked]


def gsm8k_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def _gsm8k_texts() -> list[str]:
    from m3bench.evals.datasets import DatasetName, load_split

    split = load_split(DatasetName.GSM8K, "test", data_dir=_data_dir())
    return [gsm8k_prompt(row.question) for row in split.rows]


def _data_dir() -> Path | None:
    """$M3BENCH_DATA, else the shared/data beside the checkout when it is there."""
    if os.environ.get("M3BENCH_DATA"):
        return Path(os.environ["M3BENCH_DATA"])
    shared = Path(__file__).resolve().parents[3] / "shared" / "data"
    return shared if shared.is_dir() else None


def _jsonl_texts(path: Path | None) -> list[str]:
    """One prompt per line: the field `prompt`, else `text`, else `question` (GSM8K format)."""
    if path is None or not Path(path).is_file():
        raise InputError(f"--dataset: no such jsonl file: {path}")
    texts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), 1):
        if line.strip():
            texts.append(_text_of(json_object_line(line, path, n), path, n))
    if not texts:
        raise InputError(f"--dataset {path}: no prompts")
    return texts


def json_object_line(line: str, path: Path, n: int) -> dict:
    """Line `n` of a JSON-lines file as a dict; InputError `path:n: ...` when it is not a JSON object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{n}: not JSON ({e})") from e
    if not isinstance(row, dict):
        raise InputError(f"{path}:{n}: expected a JSON object")
    return row


def _text_of(row: dict, path: Path, n: int) -> str:
    if isinstance(row.get("prompt"), str):
        return row["prompt"]
    if isinstance(row.get("text"), str):
        return row["text"]
    if isinstance(row.get("question"), str):
        return gsm8k_prompt(row["question"])
    raise InputError(f"{path}:{n}: no string field 'prompt', 'text' or 'question'")
