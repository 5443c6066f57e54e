"""The shipped trained tiny M3 (runtime/assets/tiny-m3-skill): complete, small, in the wheel's package data,
loadable with its draft, and its task set regenerated bit for bit from the recorded seed and sizes."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from m3bench.evals.synthetic import FILES, cached_task_set, file_sha256s
from m3bench.runtime.tiny_skill import SKILL_DIR, TaskSetId, shipped_task_set, shipped_tiny_skill, shipped_tiny_skill_eagle3

ROOT = Path(__file__).resolve().parents[2]
MAX_BYTES = 13 * 2**20  # target (~9.7 MB in bf16) + draft; the wheel compresses them a little


def package_data_patterns() -> list[str]:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["m3bench.runtime"]
    return [str(Path("m3bench/runtime") / p) for p in data]


def test_assets_are_complete_small_and_package_data():
    target, draft = shipped_tiny_skill(), shipped_tiny_skill_eagle3()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (target / name).is_file(), name
    assert (draft / "config.json").is_file() and (draft / "model.safetensors").is_file()
    files = [p for p in SKILL_DIR.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < MAX_BYTES
    patterns = package_data_patterns()
    for p in files:
        rel = str(p.relative_to(ROOT))
        assert any(fnmatch.fnmatch(rel, pat) and rel.count("/") == pat.count("/") for pat in patterns), rel


def test_shipped_pair_loads_and_every_layer_kind_is_there():
    from m3bench.runtime import LLM
    from m3bench.runtime.config import ModelConfig

    cfg = ModelConfig.from_pretrained(shipped_tiny_skill())
    every = set(range(cfg.num_layers))  # dense and MSA attention, dense and MoE MLPs
    assert set(cfg.sparse_layers) not in (set(), every) and set(cfg.moe_layers) not in (set(), every)
    llm = LLM(str(shipped_tiny_skill()), speculative_model=str(shipped_tiny_skill_eagle3()))
    out = llm.generate(["Question: Ann has 3 pens. How many pens?\nAnswer:"])[0]
    assert out.token_ids


def test_task_set_regenerates_bit_for_bit_into_the_cache(tmp_path):
    ident = shipped_task_set()
    dest = cached_task_set(ident, tmp_path)
    assert file_sha256s(dest) == ident.sha256 and set(ident.sha256) == set(FILES)
    stamp = (dest / "gsm8k" / "test.jsonl").stat().st_mtime_ns
    assert cached_task_set(ident, tmp_path) == dest  # written once
    assert (dest / "gsm8k" / "test.jsonl").stat().st_mtime_ns == stamp
    wrong = TaskSetId(ident.seed + 1, ident.sizes, ident.sha256)  # a generator that no longer makes the set
    with pytest.raises(RuntimeError, match="no longer matches"):
        cached_task_set(wrong, tmp_path / "other")
    assert not list((tmp_path / "other").glob("*"))
