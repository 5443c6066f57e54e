"""Dummy weights at a vocabulary larger than the tokenizer's: the in-process bench never detokenizes."""

import json
import shutil

import pytest

from m3bench.runtime.engine_config import EngineConfig
from m3bench.bench.sweep import SweepConfig, run_sweep
from m3bench.runtime import LLM, SamplingParams
from m3bench.runtime.errors import InputError

BIG_VOCAB = 8192


@pytest.fixture(scope="module")
def big_vocab_dir(tmp_path_factory):
    """The tiny checkpoint's config with vocab 8192, beside its 2048-token tokenizer (no weights needed)."""
    from m3bench.runtime.tiny import write_tiny_checkpoint

    src = write_tiny_checkpoint(tmp_path_factory.mktemp("src"), seed=4)
    dest = tmp_path_factory.mktemp("big")
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dest / f.name)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["vocab_size"] = BIG_VOCAB
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_detokenize_false_returns_ids_past_the_tokenizer(big_vocab_dir):
    llm = LLM(big_vocab_dir, load_format="dummy", num_kv_blocks=16, tokens_per_block=16, seed=2)
    assert len(llm.tokenizer) < llm.config.vocab_size == BIG_VOCAB
    (out,) = llm.generate([[3, 4, 5, 6]], SamplingParams(max_tokens=64, ignore_eos=True, temperature=1.0, seed=1,
                                                         detokenize=False))
    assert len(out.token_ids) == 64 and out.text == ""
    assert max(out.token_ids) >= len(llm.tokenizer)  # ids the tokenizer does not know, sampled from the model
    with pytest.raises(InputError, match="detokenize"):
        SamplingParams(stop=("x",), detokenize=False)


def test_inprocess_sweep_on_a_vocab_larger_than_the_tokenizer(big_vocab_dir, tmp_path):
    opts = EngineConfig(str(big_vocab_dir), load_format="dummy", num_kv_blocks=32)
    cfg = SweepConfig(out_dir=tmp_path, engine=opts, concurrencies=(2,), lengths=((24, 8),), num_prompts=4, warmup=1)
    (row,) = run_sweep(cfg)
    assert "error" not in row, row
    assert row["num_completed"] == 4 and row["num_wrong_output_len"] == 0 and row["total_output_tokens"] >= 4 * 7
    records = [json.loads(r) for r in (tmp_path / "points" / "tp1_c2_isl24_osl8_r0.records.jsonl").read_text().splitlines()]
    assert all(sum(r["chunk_tokens"]) == r["output_tokens"] for r in records)  # token counts, not text, per chunk


def test_inprocess_sweep_without_any_tokenizer_says_so(big_vocab_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(big_vocab_dir / "config.json", bare / "config.json")
    cfg = SweepConfig(out_dir=tmp_path / "o", engine=EngineConfig(str(bare), load_format="dummy", num_kv_blocks=8),
                      lengths=((8, 2),), num_prompts=1, warmup=0)
    with pytest.raises(InputError, match="no tokenizer"):
        run_sweep(cfg)
