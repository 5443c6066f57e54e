"""Shared fixtures for bench tests: a small real byte-level BPE tokenizer trained on GSM8K text."""

import json
from pathlib import Path

import pytest

GSM8K_TEST = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def _corpus() -> list[str]:
    if GSM8K_TEST.is_file():
        return [json.loads(line)["question"] for line in GSM8K_TEST.read_text().split("\n")[:400] if line.strip()]
    return [f"Sentence number {i} about apples, trains and {i * 7} dollars." for i in range(400)]


@pytest.fixture(scope="session")
def bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
