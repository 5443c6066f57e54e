"""The tiny checkpoint's tokenizer through transformers, and M3's chat format."""

from __future__ import annotations

import json

import pytest

from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.tiny import build_tokenizer
from m3bench.runtime.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 * 7?"}]
RENDERED = ("]~!b[]~b]system\nBe brief.[e~[\n]~b]user\nWhat is 2 + 2?[e~[\n]~b]ai\n4[e~[\n"
            "]~b]user\nAnd 3 * 7?[e~[\n")


@pytest.fixture(scope="module")
def tok(tiny_ckpt) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_ckpt)


def test_auto_tokenizer_loads_the_tiny_tokenizer(tiny_ckpt):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_ckpt))
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    assert len(hf) == cfg["vocab_size"]
    assert hf.bos_token == "]~!b[" and hf.convert_tokens_to_ids("]~!b[") == cfg["bos_token_id"]
    assert hf.eos_token == "[e~[" and hf.eos_token_id == cfg["eos_token_id"]
    for t in ("]~!b[", "]~b]", "[e~[", "<mm:think>", "</mm:think>"):
        assert len(hf(t, add_special_tokens=False)["input_ids"]) == 1, t


def test_chat_template_renders_m3_format(tok):
    assert tok.render_chat(MESSAGES, add_generation_prompt=False) == RENDERED
    assert tok.render_chat(MESSAGES) == RENDERED + "]~b]ai\n"
    assert tok.render_chat(MESSAGES, thinking_mode="adaptive") == RENDERED + "]~b]ai\n"
    assert tok.render_chat(MESSAGES, thinking_mode="enabled") == RENDERED + "]~b]ai\n<mm:think>\n"
    assert tok.render_chat(MESSAGES, thinking_mode="disabled") == RENDERED + "]~b]ai\n<mm:think>\n</mm:think>\n"


def test_bad_thinking_mode_or_role_is_an_error(tok):
    with pytest.raises(Exception, match="thinking_mode"):
        tok.render_chat(MESSAGES, thinking_mode="sometimes")
    with pytest.raises(Exception, match="unknown role"):
        tok.render_chat([{"role": "narrator", "content": "x"}])


def test_chat_ids_round_trip_with_one_bos(tok):
    ids = tok.apply_chat_template(MESSAGES)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids) == RENDERED + "]~b]ai\n"
    close = tok.hf.convert_tokens_to_ids("[e~[")
    assert ids.count(close) == 4 and close in tok.eos_token_ids


def test_plain_text_round_trip(tok):
    text = "Step 12: the train leaves at 9, costs $42.50 and naïve café ☕ text survives."
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids) and tok.decode(ids) == text
    assert tok.decode(tok.encode("<mm:think>why</mm:think>ok"), skip_special_tokens=True) == "<mm:think>why</mm:think>ok"


def test_bpe_training_is_deterministic():
    assert build_tokenizer(1024).to_str() == build_tokenizer(1024).to_str()


def test_too_large_vocab_for_the_corpus_is_refused():
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        build_tokenizer(200_000)


def test_missing_tokenizer_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="cannot load the tokenizer"):
        Tokenizer.from_pretrained(tmp_path)


def test_real_tokenizers_stop_on_their_turn_close(smollm2_dir, qwen05_dir):
    for path, close in ((smollm2_dir, "<|im_end|>"), (qwen05_dir, "<|im_end|>")):
        tok = Tokenizer.from_pretrained(path)
        assert tok.hf.convert_tokens_to_ids(close) in tok.eos_token_ids
        ids = tok.apply_chat_template([{"role": "user", "content": "Hello"}])
        assert tok.decode(ids).rstrip().endswith("assistant")


@pytest.mark.parametrize("loader", ["m3bench.runtime.tokenizer:Tokenizer.from_pretrained",
                                    "m3bench.bench.sweep:_tokenizer", "m3bench.evals.backends.openai:_load_tokenizer"])
def test_no_tokenizer_load_warns_about_the_m3_model_type(tiny_ckpt, loader):
    """AutoTokenizer reads an M3 config.json and logs 'a model of type `minimax_m3` to instantiate a model of type
    ``' (once a process); every loader of m3bench (the runtime's, the sweep client's, the OpenAI backend's) goes
    through load_hf_tokenizer, which keeps that out of the user's output (sweep printed it before each run)."""
    import subprocess
    import sys

    module, name = loader.split(":")
    code = (f"import importlib; obj = importlib.import_module({module!r})\n"
            f"for part in {name!r}.split('.'): obj = getattr(obj, part)\n"
            f"assert obj({str(tiny_ckpt)!r}) is not None")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "to instantiate a model of type" not in done.stderr
