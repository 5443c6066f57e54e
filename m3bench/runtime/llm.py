"""The public runtime API: `LLM` and `SamplingParams`.

    llm = LLM("ckpt", device="cuda", dtype="bfloat16")       # or LLM(model_dir, load_format="dummy")
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.7, seed=1))
    outs[0].token_ids, outs[0].text, outs[0].logprobs, outs[0].timings, outs[0].finish_reason
    llm.score([(context_ids, continuation_ids)])   # [(sum_logprob, is_greedy)]
    llm.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=5))[0].prompt_logprobs  # tokens 1.. (no cache reuse)
    rid = llm.add_request([1, 2, 3], SamplingParams()); deltas = llm.step(); llm.abort(rid)
    for delta in llm.stream(["Hi"], SamplingParams(max_tokens=8)): ...
"""

from __future__ import annotations

import itertools
import weakref
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Sequence as Seq

import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.block_manager import BlockManager, blocks_for_budget
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.engine import DecodeGraphs, Engine, ModelRunner, RequestDelta
from m3bench.runtime.errors import InputError
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.overlap_engine import OverlapEngine
from m3bench.runtime.sampler import Sampler
from m3bench.runtime.scheduler import Scheduler
from m3bench.runtime.sequence import SamplingParams, Sequence, Timings

__all__ = ["LLM", "SamplingParams", "RequestOutput", "RequestDelta", "LoadFormat"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}
CPU_DEFAULT_POOL_TOKENS = 16384  # pool size on CPU when num_kv_blocks is not given


class LoadFormat(Enum):
    AUTO = "auto"  # weights from the checkpoint's safetensors
    DUMMY = "dummy"  # random weights (benchmarking); only config.json is read


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
                 cuda_graphs: bool = False, seed: int = 0, config: ModelConfig | str | Path | None = None,
                 tokenizer: Any = None, attention_backend: str = "auto", speculative_model: Any = None,
                 draft_len: int = 3, draft_kv: str = "separate", synthetic_acceptance_length: float | None = None,
                 draft_page_size: int | None = None, tensor_parallel_size: int = 1,
                 async_scheduling: bool | None = None) -> None:
        """`model`: a checkpoint directory, or an M3ForCausalLM already built (its device and dtype win).

        `attention_backend`: "auto" (Triton on CUDA, torch on CPU; a model built by the caller keeps
        its own backend), "torch" or "triton". `tensor_parallel_size` N > 1 runs the model over N
        processes (m3bench spawns ranks 1..N-1, or joins torchrun's; see runtime/distributed).
        `async_scheduling`: schedule step N+1 while step N runs (runtime/overlap_engine; same outputs, deltas
        one step() later); None: on for CUDA without speculation or tensor parallelism, off otherwise."""
        _check_sizes(tokens_per_block, max_batch_size, max_num_tokens)
        self._tp = _start_tp(tensor_parallel_size, model, config, dtype, device, load_format, seed, attention_backend,
                             tokens_per_block, cuda_graphs, speculative_model)
        if self._tp is not None:  # workers stop with this LLM (also when the rest of __init__ fails)
            weakref.finalize(self, self._tp.shutdown)
        self.model = _build_model(model, config, _dtype(dtype), self._tp.device if self._tp else torch.device(device),
                                  _load_format(load_format), seed, self._tp.tp if self._tp else None)
        _pick_backend(self.model, attention_backend, tokens_per_block, prebuilt=self.model is model)
        self.device, self.dtype = self.model.device, self.model.dtype
        self.config: ModelConfig = self.model.cfg
        self._tok = _load_tokenizer(model) if tokenizer is None else None
        self.tokenizer = tokenizer if tokenizer is not None else getattr(self._tok, "hf", None)  # transformers'
        _check_graphs(cuda_graphs, self.device, self.model)
        self.spec, self.draft = _spec_setup(self.model, speculative_model, draft_len, draft_kv,  # Eagle3 (or None)
                                            synthetic_acceptance_length, draft_page_size,
                                            _draft_dummy_seed(load_format, seed))
        enable_prefix_caching = enable_prefix_caching and _spec_caching(self.spec)
        kv_dtype = _kv_dtype(kv_cache_dtype)
        num_blocks = self._pool_size(num_kv_blocks, tokens_per_block, kv_dtype, gpu_memory_utilization,
                                     max_num_tokens)
        self.async_scheduling = _async_choice(async_scheduling, self.device, self.spec, self._tp)
        self.engine = self._build_engine(num_blocks, tokens_per_block, kv_dtype, max_batch_size, max_num_tokens,
                                         enable_prefix_caching, seed, cuda_graphs)
        self._ids = itertools.count()
        self._tracked: dict[int, Sequence] = {}  # requests whose Sequence the caller will read back

    def _pool_size(self, num_kv_blocks: int | None, P: int, kv_dtype: KVDtype, utilization: float,
                   max_num_tokens: int) -> int:
        if num_kv_blocks is not None:
            if num_kv_blocks <= 0:
                raise InputError(f"num_kv_blocks must be positive, got {num_kv_blocks}")
            return num_kv_blocks
        if self.device.type != "cuda":
            return -(-CPU_DEFAULT_POOL_TOKENS // P)
        page_b = KVCache.page_bytes(self.config, P, kv_dtype, self.dtype, self.model.tp) + self._draft_bytes(P, kv_dtype)
        if self._tp is not None:  # every rank profiles and sizes its pool; the smallest wins
            self._tp.start_profile(min(max_num_tokens, self.config.max_position_embeddings), P, kv_dtype, page_b,
                                   utilization)
        self._profile_run(P, kv_dtype, max_num_tokens)
        n = blocks_for_budget(page_b, self.device, utilization)
        n = n if self._tp is None else self._tp.agree_min(n)
        return max(n - 1, 1)  # room for the scratch page of CUDA graphs

    @torch.inference_mode()
    def _profile_run(self, P: int, kv_dtype: KVDtype, max_num_tokens: int) -> None:
        """One prefill of a full token budget on a throw-away cache, so the activation peak is known."""
        n = min(max_num_tokens, self.config.max_position_embeddings)
        pages = -(-n // P)
        kv = KVCache(self.config, pages, P, kv_dtype, self.dtype, self.device, self.model.tp)
        meta = build_attn_metadata([n], [n], [list(range(pages))], P, self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        hidden = self.model(torch.zeros(n, dtype=torch.int64, device=self.device), meta.positions, meta, kv)
        self.model.compute_logits(hidden[-1:])
        del kv, hidden
        torch.cuda.empty_cache()

    def _build_engine(self, num_blocks: int, P: int, kv_dtype: KVDtype, max_batch_size: int, max_num_tokens: int,
                      caching: bool, seed: int, graphs: bool) -> Engine:
        max_pos = self.config.max_position_embeddings
        max_pages = min(-(-max_pos // P), num_blocks)
        self.max_model_len = min(max_pos, max_pages * P) - _spec_lookahead(self.spec)
        extra = 1 if graphs else 0  # graphs: one scratch page, owned by no request, for padding rows
        if self._tp is not None:
            self._tp.alloc(num_blocks + extra, P, kv_dtype)  # the other ranks' pools mirror this one
        kv = KVCache(self.config, num_blocks + extra, P, kv_dtype, self.dtype, self.device, self.model.tp)
        bm = BlockManager(num_blocks, P, max_batch_size, max_pages, self.device, caching)
        plain_graphs = graphs and self.spec is None  # speculation captures its own (speculative/graphs.py)
        decode_graphs = DecodeGraphs(self.model, kv, bm, num_blocks, max_batch_size) if plain_graphs else None
        if decode_graphs is not None:
            decode_graphs.capture()
        runner = (ModelRunner(self.model, kv, bm, self.device, decode_graphs) if self._tp is None else
                  _tp_runner(self._tp, self.model, kv, bm, self.device))
        scheduler = Scheduler(bm, max_batch_size, max_num_tokens)
        if self.spec is not None:
            from m3bench.runtime.speculative.setup import build_spec_engine

            engine = build_spec_engine(self.model, kv, bm, scheduler, Sampler(self.device, seed), self.tokenizer,
                                       _eos_ids(self.config, self._tok), self.max_model_len, self.spec, self.draft,
                                       max_batch_size, max_num_tokens, graphs)
            if self._tp is not None:  # the target's and the draft's calls then run on every rank
                from m3bench.runtime.distributed.mirror import mirror_spec_runner

                mirror_spec_runner(self._tp, engine.spec, kv)
            return engine
        engine_cls = OverlapEngine if self.async_scheduling else Engine
        return engine_cls(runner, scheduler, Sampler(self.device, seed), self.tokenizer,
                          _eos_ids(self.config, self._tok), self.max_model_len)

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

    def _draft_bytes(self, P: int, kv_dtype: KVDtype) -> int:
        if self.draft is None:
            return 0
        from m3bench.runtime.speculative.setup import draft_bytes_per_target_page

        return draft_bytes_per_target_page(self.draft.cfg, P, kv_dtype, self.dtype)

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
            return list(self.tokenizer.encode(prompt))
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


def _as_prompt_list(prompts: Any) -> list:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt of token ids
    return prompts


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise InputError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[name]


def _kv_dtype(name: str | KVDtype) -> KVDtype:
    if isinstance(name, KVDtype):
        return name
    try:
        return KVDtype(name)
    except ValueError:
        raise InputError(f"unknown kv_cache_dtype {name!r} (choose from {', '.join(k.value for k in KVDtype)})") from None


def _pick_backend(model: Any, name: str, tokens_per_block: int, prebuilt: bool) -> None:
    """Install the chosen attention backend (AUTO: Triton on CUDA, torch on CPU; a model the caller
    built keeps its own) and check that it can serve the model at this page size."""
    from m3bench.runtime.attention import select

    choice = select.attention_choice(name)
    if not (prebuilt and choice is select.AttentionChoice.AUTO):
        model.backend = select.make_backend(choice, model.device, model.cfg)
    select.check_backend_layout(model.backend, model.cfg, tokens_per_block)


def _async_choice(requested: bool | None, device: torch.device, spec: Any, tp: Any) -> bool:
    """Overlap scheduling: on by default for CUDA without speculation or tensor parallelism (1.09-1.19x decode
    tok/s on the H200 with identical tokens, benchmarks/overlap_speed.py, docs/performance.md section 5);
    off by default on CPU (nothing to overlap); not with speculation or tensor parallelism (yet)."""
    if requested is None:
        return device.type == "cuda" and spec is None and tp is None
    if requested and spec is not None:
        raise InputError("async_scheduling is not supported with speculative decoding: pass async_scheduling=False")
    if requested and tp is not None:
        raise InputError("async_scheduling is not supported with tensor_parallel_size > 1 yet")
    return bool(requested)


def _check_graphs(cuda_graphs: bool, device: torch.device, model: Any) -> None:
    if not cuda_graphs:
        return
    if device.type != "cuda":
        raise InputError("cuda_graphs needs a CUDA device")
    if not getattr(model.backend, "graph_safe", False):
        raise InputError("cuda_graphs needs a graph-safe attention backend; the torch backend reads host lengths")


def _load_format(name: str | LoadFormat) -> LoadFormat:
    try:
        return LoadFormat(name)
    except ValueError:
        raise InputError(f"unknown load_format {name!r} (choose from auto, dummy)") from None


def _check_sizes(P: int, max_batch_size: int, max_num_tokens: int) -> None:
    for name, v in (("tokens_per_block", P), ("max_batch_size", max_batch_size), ("max_num_tokens", max_num_tokens)):
        if v <= 0:
            raise InputError(f"{name} must be positive, got {v}")


def _build_model(model: Any, config: Any, dtype: torch.dtype, device: torch.device, fmt: LoadFormat, seed: int,
                 tp: Any = None):
    from m3bench.runtime.model import M3ForCausalLM

    if isinstance(model, M3ForCausalLM):
        return model
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_pretrained(Path(config or _dir(model)))
    m = M3ForCausalLM(cfg, dtype=dtype, device=device, tp=tp)  # tp: this rank's shards only
    if fmt is LoadFormat.DUMMY:
        m.init_dummy(seed)
    else:
        from m3bench.runtime.checkpoint import CheckpointReader

        reader = CheckpointReader(_dir(model), cfg)
        reader.validate()
        m.load_weights(reader)
    return m


def _dir(model: Any) -> Path:
    if model is None:
        raise InputError("no model directory given (pass a path, or config=... with load_format='dummy')")
    p = Path(model)
    if not p.is_dir():
        raise InputError(f"model directory {p} does not exist")
    return p


def _load_tokenizer(model: Any) -> Any:
    """The checkpoint's tokenizer (m3bench.runtime.tokenizer.Tokenizer), or None when the directory has none."""
    if not isinstance(model, (str, Path)) or not any(
            (Path(model) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from m3bench.runtime.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(model)


def _eos_ids(cfg: ModelConfig, tok: Any) -> tuple[int, ...]:
    """EOS ids of config.json plus, with a checkpoint tokenizer, generation_config.json and turn-close tokens."""
    return tuple(dict.fromkeys([*cfg.eos_token_ids, *getattr(tok, "eos_token_ids", ())]))


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", file=sys.stderr)


def _spec_setup(model: Any, draft: Any, draft_len: int, draft_kv: str, synthetic_al: float | None,
                page_size: int | None, dummy_seed: int | None = None) -> tuple[Any, Any]:
    """(SpecConfig, Eagle3Draft) for speculative_model=..., or (None, None); `dummy_seed`: random draft weights."""
    if draft is None:
        return None, None
    from m3bench.runtime.speculative.config import DraftKVLayout, SpecConfig
    from m3bench.runtime.speculative.setup import load_draft

    try:
        layout = DraftKVLayout(draft_kv)
    except ValueError:
        raise InputError(f"unknown draft_kv {draft_kv!r} (choose from separate, shared)") from None
    where = draft if isinstance(draft, (str, Path)) else "."
    spec = SpecConfig(Path(where), draft_len, layout, page_size, synthetic_acceptance_length=synthetic_al)
    return spec, load_draft(draft, model, dummy_seed)


def _draft_dummy_seed(load_format: str | LoadFormat, seed: int) -> int | None:
    """load_format="dummy" covers the draft too: only its config.json is read (seed + 1: not the target's)."""
    return seed + 1 if _load_format(load_format) is LoadFormat.DUMMY else None


def _spec_caching(spec: Any) -> bool:
    if spec is None:
        return True
    from m3bench.runtime.speculative.setup import caching_allowed

    return caching_allowed(spec)


def _spec_lookahead(spec: Any) -> int:
    return 0 if spec is None else 2 * spec.draft_len


def _start_tp(world: int, model: Any, config: Any, dtype: str, device: str, load_format: str, seed: int,
              attention_backend: str, P: int, graphs: bool, draft: Any):
    """The tensor-parallel Driver of rank 0 (None at TP 1); see m3bench.runtime.distributed."""
    if world == 1:  # (under torchrun too: each process then runs its own TP-1 engine)
        return None
    from m3bench.runtime.distributed.driver import start_driver
    from m3bench.runtime.distributed.worker import WorkerSpec
    from m3bench.runtime.model import M3ForCausalLM

    if world > 1 and isinstance(model, M3ForCausalLM):
        raise InputError("tensor_parallel_size > 1 needs a checkpoint directory (each rank loads its own shards)")
    if graphs:
        raise InputError("tensor_parallel_size > 1 does not capture cuda_graphs yet: run without them")
    if draft is not None and not isinstance(draft, (str, Path)):
        raise InputError("tensor_parallel_size > 1 needs the draft as a checkpoint directory (each rank loads it)")
    _load_format(load_format)
    spec = WorkerSpec(None if model is None else str(model), config, _dtype(dtype), str(device), load_format, seed,
                      attention_backend, P, None if draft is None else str(draft))
    return start_driver(world, spec)


def _tp_runner(driver: Any, model: Any, kv: KVCache, bm: BlockManager, device: torch.device) -> ModelRunner:
    from m3bench.runtime.distributed.driver import DriverRunner

    return DriverRunner(driver, model, kv, bm, device)
