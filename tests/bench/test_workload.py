"""Workload prompts have exact token lengths and survive a decode/encode round trip."""

import json

import pytest

from m3bench.bench.workload import (DatasetKind, LengthRange, RangeKind, dataset_prompts, gsm8k_prompt,
                                    random_prompts)
from m3bench.runtime.errors import InputError


def test_random_prompts_exact_lengths_round_trip(bpe_tokenizer):
    prompts = random_prompts(bpe_tokenizer, isl=64, osl=16, num=12, lengths=LengthRange(RangeKind.INFERENCEX), seed=3)
    special = set(bpe_tokenizer.all_special_ids)
    for p in prompts:
        assert 52 <= p.prompt_len <= 64 and 13 <= p.output_len <= 16  # [0.8 L, L]
        assert bpe_tokenizer.encode(p.text, add_special_tokens=False) == list(p.token_ids)
        assert not special & set(p.token_ids)
    assert len({p.prompt_len for p in prompts}) > 1


def test_vllm_range_and_fixed_lengths(bpe_tokenizer):
    prompts = random_prompts(bpe_tokenizer, 40, 10, 10, LengthRange(RangeKind.VLLM, 0.5), seed=1)
    assert all(20 <= p.prompt_len <= 60 and 5 <= p.output_len <= 15 for p in prompts)
    fixed = random_prompts(bpe_tokenizer, 33, 7, 5, LengthRange(RangeKind.VLLM), seed=1)
    assert [p.prompt_len for p in fixed] == [33] * 5 and [p.output_len for p in fixed] == [7] * 5
    for p in fixed:
        assert len(bpe_tokenizer.encode(p.text, add_special_tokens=False)) == 33


def test_seeded_locally(bpe_tokenizer):
    a = random_prompts(bpe_tokenizer, 20, 4, 3, seed=7)
    b = random_prompts(bpe_tokenizer, 20, 4, 3, seed=7)
    c = random_prompts(bpe_tokenizer, 20, 4, 3, seed=8)
    assert a == b and a != c


def test_bad_ranges_raise(bpe_tokenizer):
    with pytest.raises(InputError):
        LengthRange(RangeKind.VLLM, 1.0).bounds(10)
    with pytest.raises(InputError):
        LengthRange(RangeKind.INFERENCEX, 0.0).bounds(10)
    with pytest.raises(InputError):
        random_prompts(bpe_tokenizer, 0, 4, 3)


def test_jsonl_dataset(bpe_tokenizer, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "Hello there"}) + "\n" + json.dumps({"question": "2+2?"}) + "\n")
    prompts = dataset_prompts(bpe_tokenizer, DatasetKind.JSONL, osl=5, num=5, path=path, seed=0)
    assert {p.text for p in prompts} == {"Hello there", gsm8k_prompt("2+2?")}
    assert all(p.output_len == 5 and p.prompt_len > 0 for p in prompts)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(InputError, match="bad.jsonl:1"):
        dataset_prompts(bpe_tokenizer, DatasetKind.JSONL, 5, 1, path=bad)


def test_gsm8k_dataset(bpe_tokenizer):
    try:
        prompts = dataset_prompts(bpe_tokenizer, DatasetKind.GSM8K, osl=8, num=3, seed=0)
    except InputError as e:
        pytest.skip(f"GSM8K not available: {e}")
    assert all(p.text.startswith("Question: ") and p.text.endswith("\nAnswer:") for p in prompts)


def test_tiny_checkpoint_tokenizer_round_trip(tmp_path):
    """With M3's special and marker tokens in the vocabulary, prompts hold none of them and stay exact."""
    from transformers import AutoTokenizer

    from m3bench.runtime.tiny import write_tokenizer

    write_tokenizer(tmp_path, 2048)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    added = set(tok.added_tokens_decoder)
    for p in random_prompts(tok, isl=100, osl=8, num=6, seed=0):
        assert 80 <= p.prompt_len <= 100 and not added & set(p.token_ids)
        assert tok.encode(p.text, add_special_tokens=False) == list(p.token_ids)
