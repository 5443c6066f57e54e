"""The checkpoint's own tokenizer and chat template, through transformers' AutoTokenizer.

    tok = Tokenizer.from_pretrained(Path("ckpt"))
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], thinking_mode="disabled")
    tok.decode(ids); tok.eos_token_ids      # every id that ends a generation
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m3bench.runtime.errors import CheckpointError

# Turn-close tokens that stop a chat generation even where the config names another EOS.
STOP_TOKENS = ("[e~[", "<|im_end|>", "<|eot_id|>", "<|endoftext|>")


def load_hf_tokenizer(path: Path | str) -> Any:
    """transformers' AutoTokenizer of `path`, without the warning it logs on reading an M3 config.json ("a model
    of type `minimax_m3` to instantiate a model of type ``"): every tokenizer load of m3bench goes through here."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(path))
    finally:
        hf_logging.set_verbosity(level)


@dataclass(frozen=True)
class Tokenizer:
    """A transformers tokenizer (`hf`) plus the stop ids gathered from the checkpoint's files."""

    hf: Any
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_pretrained(cls, path: Path | str) -> "Tokenizer":
        """Load `path`'s tokenizer.json / tokenizer_config.json / chat template."""
        path = Path(path)
        try:
            hf = load_hf_tokenizer(path)
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"cannot load the tokenizer of {path}: {str(e).splitlines()[0]}") from None
        return cls(hf=hf, eos_token_ids=stop_ids(hf, path), bos_token_id=hf.bos_token_id)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The chat template's text for `messages` (kwargs such as thinking_mode go to the template)."""
        if not getattr(self.hf, "chat_template", None):
            raise CheckpointError("this checkpoint's tokenizer has no chat template")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                           **template_kwargs)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **template_kwargs) -> list[int]:
        """Token ids of the rendered chat; the template writes BOS itself, so none is added here."""
        return self.encode(self.render_chat(messages, add_generation_prompt, **template_kwargs))


def stop_ids(hf: Any, path: Path) -> tuple[int, ...]:
    """EOS ids from config.json, generation_config.json and the tokenizer, plus known turn-close tokens."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        ids += _json_eos(path / name)
    if hf.eos_token_id is not None:
        ids.append(hf.eos_token_id)
    vocab = hf.get_vocab()
    ids += [vocab[t] for t in STOP_TOKENS if t in vocab]
    return tuple(dict.fromkeys(int(i) for i in ids))


def _json_eos(file: Path) -> list[int]:
    if not file.exists():
        return []
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError:
        return []  # config.json errors are ModelConfig's to report
    raw = raw.get("text_config", raw) if raw.get("eos_token_id") is None else raw
    e = raw.get("eos_token_id")
    return [] if e is None else [int(x) for x in (e if isinstance(e, list) else [e])]
