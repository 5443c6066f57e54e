"""The evaluation backend of m3bench's own runtime (`m3bench.runtime.LLM`).

    backend = RuntimeBackend(EngineConfig(model=Path("ckpt"), device="cpu", dtype="float32"))
    backend.generate([GenRequest(prompt="Question: 1+1?\\nAnswer:")], on_done)

Text is tokenized here, the way lm-eval's HF model does it: no special tokens added to raw prompts
(chat prompts carry theirs in the template), and a score pair is split lm-eval style (trailing
whitespace of the context moves into the continuation; the continuation's ids are those of the
whole string past the context's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from m3bench.evals.backends.base import GenCallback, GenRequest, GenResult, ScoreCallback, ScoreRequest, ScoreResult
from m3bench.runtime.engine_config import EngineConfig, resolve
from m3bench.runtime.errors import InputError


class RuntimeBackend:
    name = "runtime"

    def __init__(self, options: EngineConfig):
        from m3bench.runtime.llm import LLM

        self.options = options if options.is_resolved else resolve(options)
        self.llm = LLM.from_config(self.options)
        if self.llm.tokenizer is None:
            raise InputError(f"{options.model} has no tokenizer: text evaluations need one")

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenizer.encode(text, add_special_tokens=False))

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> str:
        return self.llm.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True, **kwargs)

    def _prompt_ids(self, request: GenRequest) -> list[int]:
        if request.messages is not None:
            return self.tokenize(self.apply_chat_template(request.messages, **dict(request.chat_template_kwargs)))
        return self.tokenize(request.prompt or "")

    def generate(self, requests: Sequence[GenRequest], on_done: GenCallback) -> None:
        """Queue every request, step the engine, report each one as it finishes."""
        live = {}
        for index, r in enumerate(requests):
            ids = self._prompt_ids(r)
            live[self._submit(ids, r)] = _Pending(index, r, len(ids))
        while live:
            if not self.llm.has_unfinished():
                raise RuntimeError(f"the engine went idle with {len(live)} requests unreported")
            for d in self.llm.step():
                pending = live.get(d.request_id)
                if pending is None:
                    continue
                pending.pieces.append(d.text)
                pending.num_tokens += len(d.token_ids)
                if d.finished:
                    del live[d.request_id]
                    on_done(pending.index, pending.result(d.finish_reason, self._spec_of(d.request_id)))

    def _spec_of(self, request_id: int) -> dict[str, Any]:
        """The request's acceptance counters and figures (SpecStats); empty without speculation or drafts."""
        stats = self.llm.request_spec_stats(request_id) if self.options.draft is not None else None
        return {} if stats is None else stats.to_dict()

    def _submit(self, ids: list[int], r: GenRequest) -> int:
        from m3bench.runtime import SamplingParams

        params = SamplingParams(max_tokens=r.max_tokens, temperature=r.temperature, seed=r.seed, stop=r.stop)
        return self.llm.add_request(ids, params)

    def score(self, requests: Sequence[ScoreRequest], on_done: ScoreCallback) -> None:
        step = self.options.max_batch_size  # pairs per engine call; results are reported (and saved) per chunk
        for start in range(0, len(requests), step):
            chunk = requests[start:start + step]
            results = self.llm.score([self.encode_pair(r.context, r.continuation) for r in chunk])
            for offset, (logprob, greedy) in enumerate(results):
                on_done(start + offset, ScoreResult(logprob, greedy))

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's `_encode_pair`."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self.tokenize(context + continuation)
        context_ids = self.tokenize(context)
        return context_ids, whole[len(context_ids):]

    def describe(self) -> dict[str, Any]:
        o, d = self.options, self.options.to_dict()
        return {"model": d["model"], "device": o.device, "dtype": d["dtype"], "kv_cache_dtype": d["kv_cache_dtype"],
                "draft": d["draft"], "draft_len": o.draft_len if o.draft else None,
                "draft_kv": d["draft_kv"] if o.draft else None,
                "max_batch_size": o.max_batch_size, "devices": _devices(o.device),
                "engine": resolved_engine(self.llm)}

    def close(self) -> None:
        self.llm = None


@dataclass
class _Pending:
    """A queued generation: where it goes and what it has produced so far."""

    index: int
    request: GenRequest
    num_prompt_tokens: int
    pieces: list[str] = field(default_factory=list)
    num_tokens: int = 0

    def result(self, finish_reason: str | None, spec: dict[str, Any]) -> GenResult:
        text = cut_at_stop("".join(self.pieces), self.request.stop)
        return GenResult(text, "length" if finish_reason == "length" else "stop", self.num_prompt_tokens, self.num_tokens,
                         spec)


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """lm-eval's `until`: keep the text before the first stop string."""
    for s in stop:
        text = text.split(s)[0]
    return text


def resolved_engine(llm: Any) -> dict[str, Any] | None:
    """What the engine resolved from its options (page pool, limits, backends): the rest of its config."""
    if llm is None:
        return None
    bm = llm.engine.scheduler.bm
    return {"config": llm.engine_config.to_dict(), "dtype": str(llm.dtype), "device": str(llm.device),
            "max_model_len": llm.max_model_len,
            "tokens_per_block": bm.P, "num_kv_blocks": bm.num_blocks, "prefix_caching": bm.caching,
            "attention_backend": type(llm.model.backend).__name__, "async_scheduling": llm.async_scheduling,
            "speculative": llm.spec is not None}


def _devices(device: str) -> list[str]:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [device]
