"""The public runtime API: `LLM` and `SamplingParams`.

    llm = LLM("ckpt", device="cuda", dtype="bfloat16")       # or LLM(model_dir, load_format="dummy")
    llm = LLM.from_config(EngineConfig(Path("ckpt")))          # what every command builds (engine_config.py)
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.7, seed=1))
    outs[0].token_ids, outs[0].text, outs[0].logprobs, outs[0].timings, outs[0].finish_reason
    llm.score([(context_ids, continuation_ids)])   # [(sum_logprob, is_greedy)]
    llm.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=5))[0].prompt_logprobs  # tokens 1.. (no cache reuse)
    rid = llm.add_request([1, 2, 3], SamplingParams()); deltas = llm.step(); llm.abort(rid)
    for delta in llm.stream(["Hi"], SamplingParams(max_tokens=8)): ...

`LLM` is the API over an engine; engine_builder.py builds the engine's parts.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence as Seq

import torch

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.engine import RequestDelta
from m3bench.runtime.engine_builder import EngineParts, Prebuilt, build
from m3bench.runtime.engine_config import EngineConfig, LoadFormat, resolve
from m3bench.runtime.errors import InputError
from m3bench.runtime.model_builder import TORCH_DTYPES
from m3bench.runtime.sequence import SamplingParams, Sequence, Timings

__all__ = ["LLM", "SamplingParams", "RequestOutput", "RequestDelta", "LoadFormat"]

@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float] | None  # of each generated token (when SamplingParams.logprobs is set)
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: str  # "stop" / "length" / "abort"
    timings: Timings
    num_cached_tokens: int  # prompt tokens served by the prefix cache at the last admission
    spec: Any = None  # SpecStats of the request under speculation (spec.synthetic: tokens are not the model's)
    prompt_logprobs: list[float] | None = None  # with SamplingParams.prompt_logprobs: of prompt tokens 1..n-1
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None  # their top n (id, logprob), best first


@dataclass(frozen=True)
class LLMStats:
    num_running: int
    num_waiting: int
    kv_pages_total: int
    kv_pages_free: int  # free plus evictable cached pages
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int


class LLM:
    def __init__(self, model: str | Path | Any | None = None, device: str = "cpu", dtype: str = "float32",
                 kv_cache_dtype: str = "auto", tokens_per_block: int = 128, load_format: str = "auto",
                 max_batch_size: int = 64, max_num_tokens: int = 2048, num_kv_blocks: int | None = None,
                 gpu_memory_utilization: float = 0.9, enable_prefix_caching: bool = True,
                 cuda_graphs: bool | None = False, seed: int = 0, config: ModelConfig | str | Path | None = None,
                 tokenizer: Any = None, attention_backend: str = "auto", speculative_model: Any = None,
                 draft_len: int = 3, draft_kv: str = "separate", synthetic_acceptance_length: float | None = None,
                 draft_page_size: int | None = None, tensor_parallel_size: int = 1,
                 async_scheduling: bool | None = None, max_model_len: int | None = None,
                 weights_dtype: str = "auto", attention_dp: bool = False) -> None:
        """`model`: a checkpoint directory, or an M3ForCausalLM already built (its device and dtype win).

        The keywords are EngineConfig's fields under their library names (`speculative_model`: the draft
        directory, or an Eagle3 draft already built; `synthetic_acceptance_length`; `tensor_parallel_size`);
        `config`: a ModelConfig or config directory; `tokenizer`: a transformers tokenizer. Defaults differ from
        EngineConfig's on purpose: CPU, float32, no CUDA graphs unless asked. `async_scheduling` None: overlap
        on for CUDA without tensor parallelism (with speculation too)."""
        prebuilt = Prebuilt(model=None if _is_dir_like(model) else model, model_config=config, tokenizer=tokenizer,
                            draft=None if _is_dir_like(speculative_model) else speculative_model)
        if prebuilt.model is not None:
            device, dtype = str(prebuilt.model.device), prebuilt.model.dtype
        cfg = EngineConfig(
            model=model if _is_dir_like(model) else None, load_format=load_format, device=device,
            dtype=_dtype_name(dtype), kv_cache_dtype=getattr(kv_cache_dtype, "value", kv_cache_dtype),
            tokens_per_block=tokens_per_block, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
            num_kv_blocks=num_kv_blocks, gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching, cuda_graphs=cuda_graphs, async_scheduling=async_scheduling,
            attention_backend=attention_backend, tensor_parallel_size=tensor_parallel_size, seed=seed,
            draft=_draft_path(speculative_model), draft_len=draft_len, draft_kv=draft_kv,
            synthetic_acceptance=synthetic_acceptance_length, draft_page_size=draft_page_size,
            max_model_len=max_model_len, weights_dtype=weights_dtype, attention_dp=attention_dp)
        self._attach(build_parts(resolve(cfg), prebuilt))

    @classmethod
    def from_config(cls, cfg: EngineConfig, prebuilt: Prebuilt = Prebuilt()) -> "LLM":
        """The engine an EngineConfig describes ("auto" settings are resolved on this machine first); the
        memory plan runs first (runtime/fit_check.py: InputError with its message when the model does not fit)."""
        from m3bench.runtime.fit_check import check_config_fits

        cfg = cfg if cfg.is_resolved else resolve(cfg)
        if prebuilt.model is None:
            check_config_fits(cfg)
        llm = cls.__new__(cls)
        llm._attach(build_parts(cfg, prebuilt))
        return llm

    def _attach(self, parts: EngineParts) -> None:
        self._tp = parts.tp
        if self._tp is not None:  # workers stop with this LLM
            weakref.finalize(self, self._tp.shutdown)
        self.engine_config: EngineConfig = parts.config
        self.model, self.engine, self.max_model_len = parts.model, parts.engine, parts.max_model_len
        self.device, self.dtype = self.model.device, self.model.dtype
        self.config: ModelConfig = self.model.cfg
        self._tok, self.tokenizer = parts.tok, parts.tokenizer  # m3bench's Tokenizer (chat template), transformers'
        self.spec, self.draft = parts.spec, parts.draft  # Eagle3 (or None)
        self.clock = parts.clock  # the engine's own step timing (bench: host ms per step, device idle share)
        self.async_scheduling = bool(parts.config.async_scheduling)
        self._ids = itertools.count()
        self._tracked: dict[int, Sequence] = {}  # requests whose Sequence the caller will read back

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (also done at exit); a no-op at TP 1."""
        if self._tp is not None:
            self._tp.shutdown()

    # ---- streaming API ----------------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id (its progress comes as `step`'s deltas)."""
        return self._submit(self._make_seq(prompt, params), track=False)

    def _make_seq(self, prompt: str | list[int], params: SamplingParams | None) -> Sequence:
        params = params or SamplingParams()
        ids = self._prompt_ids(prompt)
        if len(ids) >= self.max_model_len:
            raise InputError(f"prompt of {len(ids)} tokens leaves no room in max_model_len {self.max_model_len}")
        if params.stop and self.tokenizer is None:
            raise InputError("stop strings need a tokenizer (this model directory has none)")
        # max_tokens=0: a scoring request (with a draft loaded, the target alone scores it, no draft runs)
        prefill_only = params.prompt_logprobs is not None and params.max_tokens == 0  # scored like LLM.score
        return Sequence(request_id=next(self._ids), prompt_ids=ids, params=params, score_from=1 if prefill_only else -1)

    def _submit(self, seq: Sequence, track: bool = True) -> int:
        self.engine.add(seq)
        if track:
            self._tracked[seq.request_id] = seq
        return seq.request_id

    def step(self) -> list[RequestDelta]:
        """One engine step: new tokens, text and timestamps of every request that progressed."""
        with self.clock.step():
            return self.engine.step()

    def abort(self, request_id: int) -> bool:
        """Stop a request and free its pages; False if it was not running or waiting."""
        return self.engine.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_work()

    def stream(self, prompts: Any, params: SamplingParams | Seq[SamplingParams] | None = None
               ) -> Iterator[RequestDelta]:
        """Deltas of these prompts' requests as they are produced (request ids in order of the prompts)."""
        rids = self._add_all(prompts, params)
        live = set(rids)
        try:
            while live:
                for d in self.step():
                    if d.request_id in live:
                        yield d
                live = {r for r in live if not self._tracked[r].finished}
        finally:  # a consumer that stops early aborts what is left
            for r in rids:
                seq = self._tracked.pop(r)
                if not seq.finished:
                    self.engine.abort(r)

    # ---- batch API --------------------------------------------------------------------------------

    def generate(self, prompts: Any, params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Complete every prompt (text, or token ids); outputs in the order of the prompts."""
        rids = self._add_all(prompts, params)
        self._run_until_done(rids, use_tqdm)
        return [self._with_spec(self._output(self._tracked.pop(r))) for r in rids]

    def score(self, pairs: Seq[tuple[Seq[int], Seq[int]]], use_tqdm: bool = False) -> list[tuple[float, bool]]:
        """log P(continuation | context) and whether greedy decoding would produce the continuation."""
        rids = [self._submit(seq) for seq in [self._score_seq(list(c), list(x)) for c, x in pairs]]
        self._run_until_done(rids, use_tqdm)
        out = []
        for r in rids:
            seq = self._tracked.pop(r)
            out.append((float(sum(seq.score_logprobs)), bool(all(seq.score_greedy))))
        return out

    def apply_chat_template(self, messages: Seq[dict], **template_kwargs: Any) -> list[int]:
        """Prompt ids of a chat, rendered by the checkpoint's own template (kwargs such as thinking_mode)."""
        if self._tok is None:
            raise InputError("chat prompts need the checkpoint's tokenizer and chat template")
        return self._tok.apply_chat_template(list(messages), **template_kwargs)

    # ---- speculative decoding ---------------------------------------------------------------------

    def spec_stats(self, request_ids: Seq[int] | None = None):
        """SpecStats over every request so far (or the given ones); None without speculation.
        Raises speculative.stats.EmptySampleError when no step carried a draft."""
        if self.spec is None:
            return None
        from m3bench.runtime.speculative.stats import compute_spec_stats

        records = self.engine.spec.records
        chosen = records.values() if request_ids is None else [records[r] for r in request_ids if r in records]
        return compute_spec_stats(list(chosen), self.spec.draft_len, self.spec.synthetic_acceptance_length is not None)

    def spec_record(self, request_id: int):
        """The raw per-step (proposed, accepted) counters of one request (AcceptanceRecord), or None."""
        return None if self.spec is None else self.engine.spec.records.get(request_id)

    def request_spec_stats(self, request_id: int):
        """SpecStats of one request, or None (no speculation, or no step of it carried a draft)."""
        if self.spec is None or not any(p for p, _ in getattr(self.engine.spec.records.get(request_id), "steps", ())):
            return None
        return self.spec_stats([request_id])

    def _with_spec(self, out: RequestOutput) -> RequestOutput:
        if self.spec is None:
            return out
        import dataclasses

        return dataclasses.replace(out, spec=self.request_spec_stats(out.request_id))

    def stats(self) -> LLMStats:
        merged = getattr(self.engine, "merged_stats", None)  # attention DP: summed over the ranks' engines
        if merged is not None:
            return LLMStats(**merged())
        s, bm = self.engine.scheduler, self.engine.scheduler.bm
        return LLMStats(len(s.running), len(s.waiting), bm.num_blocks, bm.num_available,
                        bm.stats.queried_tokens, bm.stats.hit_tokens, s.num_preemptions)

    def _score_seq(self, context: list[int], continuation: list[int]) -> Sequence:
        if not context or not continuation:
            raise InputError("score needs a non-empty context and continuation")
        ids = self._prompt_ids(context + continuation)
        if len(ids) > self.max_model_len:
            raise InputError(f"{len(ids)} tokens exceed max_model_len {self.max_model_len}")
        return Sequence(request_id=next(self._ids), prompt_ids=ids, params=SamplingParams(max_tokens=0),
                        score_from=len(context))

    def _add_all(self, prompts: Any, params: SamplingParams | Seq[SamplingParams] | None) -> list[int]:
        prompts = _as_prompt_list(prompts)
        plist = params if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise InputError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        seqs = [self._make_seq(p, sp) for p, sp in zip(prompts, plist)]  # all checked before any is queued
        return [self._submit(seq) for seq in seqs]

    def _run_until_done(self, rids: list[int], use_tqdm: bool) -> None:
        bar = _progress(len(rids)) if use_tqdm else None
        pending = set(rids)
        while pending:
            if not self.engine.has_work():
                raise RuntimeError(f"engine idle with {len(pending)} requests unfinished (engine bug)")
            self.step()
            done = {r for r in pending if self._tracked[r].finished}
            pending -= done
            if bar is not None:
                bar.update(len(done))
        if bar is not None:
            bar.close()

    def _prompt_ids(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("text prompts need a tokenizer (this model directory has none); pass token ids")
            ids = list(self.tokenizer.encode(prompt))
            if not ids:
                raise InputError("empty prompt: its text encodes to no tokens")
            return ids
        ids = [int(t) for t in prompt]
        if not ids:
            raise InputError("empty prompt")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise InputError(f"token ids {bad[:5]} outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    @staticmethod
    def _output(seq: Sequence) -> RequestOutput:
        want, want_prompt = seq.params.logprobs is not None, seq.params.prompt_logprobs is not None
        return RequestOutput(seq.request_id, seq.prompt_ids, list(seq.output_ids), seq.text,
                             list(seq.logprobs) if want else None, list(seq.top_logprobs) if want else None,
                             seq.finish_reason.value, seq.timings, seq.num_cached,
                             prompt_logprobs=list(seq.score_logprobs) if want_prompt else None,
                             prompt_top_logprobs=[list(t) for t in seq.score_top] if want_prompt else None)


def build_parts(cfg: EngineConfig, prebuilt: Prebuilt) -> EngineParts:
    """engine_builder.build, or under attention DP one engine per rank behind rank 0's front."""
    if cfg.attention_dp:
        from m3bench.runtime.distributed.attention_dp import build_attention_dp

        return build_attention_dp(cfg, prebuilt)
    return build(cfg, prebuilt)


def _as_prompt_list(prompts: Any) -> list:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt of token ids
    return prompts

def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", file=sys.stderr)


def _is_dir_like(x: Any) -> bool:
    return isinstance(x, (str, Path))


def _draft_path(draft: Any) -> Path | None:
    """The draft's directory for EngineConfig; "." for a draft built by the caller (speculation is on)."""
    if draft is None:
        return None
    return Path(draft) if _is_dir_like(draft) else Path(".")


def _dtype_name(dtype: Any) -> Any:
    """A torch dtype as EngineConfig's DType (names and DType pass through)."""
    if isinstance(dtype, torch.dtype):
        names = {t: d for d, t in TORCH_DTYPES.items()}
        if dtype not in names:
            raise InputError(f"unsupported dtype {dtype}")
        return names[dtype]
    return dtype
