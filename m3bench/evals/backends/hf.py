"""`hf` backend: transformers AutoModelForCausalLM as the reference the other backends are checked against.

    backend = HFBackend(HFConfig(model_dir=Path("~/.cache/m3bench/models/smollm2-135m-instruct"), batch_size=8))
    backend.score([ScoreRequest("Answer:", " A")], on_done)

Scoring follows lm-eval's HFLM: trailing context spaces move to the continuation, the continuation's
tokens are tok(context + continuation)[len(tok(context)):], one forward of (context + continuation)[:-1]
gives the log-softmax at each continuation position; is_greedy = every continuation token is the argmax.
Generation is greedy (or sampled when temperature > 0) with stop strings, the text cut at the first stop
string as lm-eval does. Batches are length-sorted; scoring pads on the right, generation on the left.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from enum import Enum
from itertools import groupby
from pathlib import Path
from typing import Any, Iterator, Sequence

from m3bench.evals.backends.base import (
    GenCallback,
    GenRequest,
    GenResult,
    ScoreCallback,
    ScoreRequest,
    ScoreResult,
)
from m3bench.runtime.errors import InputError


class DType(Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


@dataclass(frozen=True)
class HFConfig:
    model_dir: Path
    device: str = "cpu"
    dtype: DType = DType.FLOAT32
    batch_size: int = 8
    add_bos_token: bool = False  # lm-eval's HFLM default for causal models
    max_length: int | None = None  # None: the model's max_position_embeddings

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {self.batch_size}")


def split_pair(tokenizer: Any, context: str, continuation: str, add_bos: bool = False) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM split of (context, continuation) into token ids; empty context -> [prefix_token]."""
    if not context:
        return [prefix_token_id(tokenizer)], list(tokenizer.encode(continuation, add_special_tokens=False))
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = list(tokenizer.encode(context + continuation, add_special_tokens=add_bos))
    ctx = list(tokenizer.encode(context, add_special_tokens=add_bos))
    return ctx, whole[len(ctx):]


def prefix_token_id(tokenizer: Any) -> int:
    """lm-eval HFLM's prefix for an empty context: BOS, else EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Text up to the earliest stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def batches(order: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(order), size):
        yield order[start : start + size]


ORIGINAL_M3_MODEL_TYPE = "minimax_m3"  # MiniMax's original dialect (MiniMaxM3SparseForCausalLM)


def check_transformers_loads(model_dir: Path) -> None:
    """InputError unless transformers has a model class for the checkpoint's model_type (no remote code)."""
    import json

    from transformers import CONFIG_MAPPING

    file = model_dir / "config.json"
    model_type = json.loads(file.read_text()).get("model_type") if file.is_file() else None
    if model_type == ORIGINAL_M3_MODEL_TYPE:
        raise InputError(f"{model_dir} is in MiniMax-M3's original dialect (model_type {model_type}), which "
                         "transformers does not implement: the hf backend cannot run it; use --backend runtime")
    if model_type not in CONFIG_MAPPING:
        raise InputError(f"{model_dir}: transformers has no model for model_type {model_type!r}; "
                         "the hf backend cannot run it (use --backend runtime)")


class HFBackend:
    """transformers reference backend (batched, CPU or GPU)."""

    name = "hf"

    def __init__(self, config: HFConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(config.model_dir).is_dir():
            raise InputError(f"model directory not found: {config.model_dir}")
        check_transformers_loads(Path(config.model_dir))
        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(str(config.model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(
            str(config.model_dir), dtype=getattr(torch, config.dtype.value)
        ).to(config.device).eval()
        self.max_length = config.max_length or int(getattr(self.model.config, "max_position_embeddings", 2048))
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

    # --- scoring

    def score(self, requests: Sequence[ScoreRequest], on_done: ScoreCallback) -> None:
        pairs = [split_pair(self.tokenizer, r.context, r.continuation, self.config.add_bos_token) for r in requests]
        for i, (_, cont) in enumerate(pairs):
            if not cont:
                raise InputError(f"request {i}: the continuation {requests[i].continuation!r} has no tokens")
        self.score_tokens(pairs, on_done)

    def score_tokens(self, pairs: Sequence[tuple[list[int], list[int]]], on_done: ScoreCallback) -> None:
        """Score already tokenized (context, continuation) pairs, longest first."""
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        for chunk in batches(order, self.config.batch_size):
            for i, result in zip(chunk, self._score_batch([pairs[i] for i in chunk])):
                on_done(i, result)

    def _score_batch(self, pairs: list[tuple[list[int], list[int]]]) -> list[ScoreResult]:
        import torch

        # input = (context + continuation)[-(max_length + 1):][:-1], right-padded (lm-eval's HFLM)
        inputs = [(ctx + cont)[-(self.max_length + 1) :][:-1] for ctx, cont in pairs]
        width = max(len(x) for x in inputs)
        ids = torch.full((len(inputs), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(inputs), width), dtype=torch.long)
        for row, x in enumerate(inputs):
            ids[row, : len(x)] = torch.tensor(x)
            mask[row, : len(x)] = 1
        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.config.device), attention_mask=mask.to(self.config.device)).logits
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        return [self._pair_score(logp[row], len(inputs[row]), cont) for row, (_, cont) in enumerate(pairs)]

    @staticmethod
    def _pair_score(logp: Any, n_input: int, cont: list[int]) -> ScoreResult:
        import torch

        rows = logp[n_input - len(cont) : n_input]  # [len(cont), V]: the positions predicting cont
        target = torch.tensor(cont)
        total = rows.gather(1, target[:, None]).sum().item()
        return ScoreResult(logprob=float(total), is_greedy=bool((rows.argmax(dim=-1) == target).all()))

    # --- generation

    def generate(self, requests: Sequence[GenRequest], on_done: GenCallback) -> None:
        prompts = [self._prompt_ids(i, r) for i, r in enumerate(requests)]
        key = lambda i: (requests[i].max_tokens, requests[i].temperature, requests[i].stop, requests[i].seed)
        order = sorted(range(len(requests)), key=lambda i: (key(i), -len(prompts[i])))
        for _, group in groupby(order, key=key):
            for chunk in batches(list(group), self.config.batch_size):
                for i, result in zip(chunk, self._generate_batch([prompts[i] for i in chunk], requests[chunk[0]])):
                    on_done(i, result)

    def _prompt_ids(self, i: int, req: GenRequest) -> list[int]:
        if (req.prompt is None) == (req.messages is None):
            raise InputError(f"request {i}: a GenRequest needs exactly one of prompt or messages")
        if req.messages is not None:
            text = self.apply_chat_template(req.messages, **dict(req.chat_template_kwargs))
            return list(self.tokenizer.encode(text, add_special_tokens=False))  # the template holds any BOS
        return self.tokenize(req.prompt)

    def _generate_batch(self, prompts: list[list[int]], req: GenRequest) -> list[GenResult]:
        import torch

        keep = max(1, self.max_length - req.max_tokens)  # lm-eval: the context is left-truncated to fit
        prompts = [p[-keep:] for p in prompts]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        with torch.inference_mode(), self._seeded(req.seed):
            out = self.model.generate(
                input_ids=ids.to(self.config.device), attention_mask=mask.to(self.config.device),
                **self._generate_kwargs(req),
            )
        return [self._gen_result(row.tolist(), len(prompts[r]), req) for r, row in enumerate(out[:, width:].cpu())]

    def _generate_kwargs(self, req: GenRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_new_tokens": req.max_tokens, "pad_token_id": self._pad_id}
        if req.temperature > 0:
            kwargs.update(do_sample=True, temperature=req.temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        if req.stop:
            kwargs.update(stop_strings=list(req.stop), tokenizer=self.tokenizer)
        return kwargs

    def _gen_result(self, new_ids: list[int], n_prompt: int, req: GenRequest) -> GenResult:
        # a row that finished early (EOS or a stop string) is padded with pad_token_id (often = EOS)
        ends = [i for i, t in enumerate(new_ids) if t in (self.tokenizer.eos_token_id, self._pad_id)]
        n_out = ends[0] if ends else len(new_ids)
        text, hit_stop = cut_at_stop(self.tokenizer.decode(new_ids[:n_out], skip_special_tokens=True), req.stop)
        n_out += 1 if ends and not hit_stop else 0  # the EOS token itself was generated
        finish = "stop" if ends or hit_stop else "length"
        return GenResult(text, finish, num_prompt_tokens=n_prompt, num_output_tokens=n_out)

    @contextlib.contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """Sampling with a seed draws from a forked RNG, leaving the global generator untouched."""
        import torch

        if seed is None:
            yield
            return
        with torch.random.fork_rng(devices=[] if self.config.device == "cpu" else None):
            torch.manual_seed(seed)
            yield

    # --- text helpers

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> str:
        kwargs.setdefault("add_generation_prompt", True)
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, **kwargs)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=self.config.add_bos_token))

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
            "backend": self.name, "model_dir": str(c.model_dir), "device": c.device, "dtype": c.dtype.value,
            "batch_size": c.batch_size, "add_bos_token": c.add_bos_token, "max_length": self.max_length,
        }

    def close(self) -> None:
        self.model = None
