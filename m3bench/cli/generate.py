"""`m3bench generate`: run the engine on a few prompts (greedy when --temperature is 0).

    m3bench generate --model /ckpt/tiny --prompt "Hello" --max-tokens 16
    m3bench generate --model /ckpt/tiny --prompt "Hi" --chat --temperature 0.7 --seed 1
    m3bench generate --model DIR_WITH_CONFIG --load-format dummy --prompt-ids 1,2,3 --json
    m3bench generate --model /ckpt/tiny --prompt "a" --prompt "b" --json --logprobs 3 --device cuda

With --json, one object per prompt on stdout: {"token_ids": [...], "text": ..., "logprobs": [...],
"finish_reason": ...} (logprobs: of each generated token; "top_logprobs" too with --logprobs N > 0).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli.engine_flags import WEIGHTS_DTYPE_HELP
from m3bench.cli.errors import M3BenchError, user_errors


class LoadFormatChoice(str, Enum):  # mirrors runtime.llm.LoadFormat without importing torch at start-up
    AUTO = "auto"
    DUMMY = "dummy"


class KVChoice(str, Enum):  # mirrors runtime.kv_cache.KVDtype
    AUTO = "auto"
    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    HYBRID = "hybrid"


class DraftKVChoice(str, Enum):  # mirrors runtime.speculative.config.DraftKVLayout
    SEPARATE = "separate"
    SHARED = "shared"


class WeightsDtypeChoice(str, Enum):  # mirrors runtime.fit_check.WEIGHTS_DTYPES
    AUTO = "auto"
    BFLOAT16 = "bfloat16"


class DtypeChoice(str, Enum):
    AUTO = "auto"  # bfloat16 on CUDA, float32 on CPU
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


def parse_prompt_ids(text: str) -> list[int]:
    """'1, 2,3' -> [1, 2, 3]; anything else is an input error."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise M3BenchError(f"--prompt-ids wants comma-separated non-negative integers, got {text!r}")
    return [int(p) for p in parts]


def generate(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory (with --load-format dummy: one holding config.json)."),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", help="Prompt text (repeatable)."),
    prompt_ids: Optional[list[str]] = typer.Option(None, "--prompt-ids", help="Prompt token ids, e.g. 1,2,3 (repeatable)."),
    chat: bool = typer.Option(False, "--chat", help="Wrap each --prompt as a user turn with the checkpoint's chat template."),
    max_tokens: int = typer.Option(32, "--max-tokens", min=0, help="Tokens to generate per prompt at most."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0: greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus mass in (0, 1]; 1 disables."),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Keep the k most likely tokens; 0 disables."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Per-request sampling seed (reproducible runs)."),
    logprobs: Optional[int] = typer.Option(None, "--logprobs", min=0, help="Also report the top N logprobs per token."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per prompt on stdout."),
    load_format: LoadFormatChoice = typer.Option(LoadFormatChoice.AUTO, "--load-format", help="auto: the checkpoint's weights; dummy: random."),
    kv_cache_dtype: KVChoice = typer.Option(KVChoice.AUTO, "--kv-cache-dtype", help="KV cache storage (auto: the model dtype)."),
    tokens_per_block: int = typer.Option(128, "--tokens-per-block", min=1, help="Tokens per KV page."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ..."),
    dtype: DtypeChoice = typer.Option(DtypeChoice.AUTO, "--dtype", help="Compute dtype."),
    draft: Optional[Path] = typer.Option(None, "--draft", help="Eagle3 draft checkpoint: speculative decoding."),
    draft_len: int = typer.Option(3, "--draft-len", min=1, max=15, help="Draft tokens verified per step."),
    draft_kv: DraftKVChoice = typer.Option(DraftKVChoice.SEPARATE, "--draft-kv", help="Draft KV layout."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel size: ranks (GPUs, or CPU processes) of one model."),
    weights_dtype: WeightsDtypeChoice = typer.Option(WeightsDtypeChoice.AUTO, "--weights-dtype", help=WEIGHTS_DTYPE_HELP),
) -> None:
    """Generate continuations of --prompt / --prompt-ids with m3bench's engine."""
    run_generate(**locals())


@user_errors
def run_generate(model: Path, prompt, prompt_ids, chat: bool, max_tokens: int, temperature: float, top_p: float,
                 top_k: int, seed, logprobs, as_json: bool, load_format: LoadFormatChoice, kv_cache_dtype: KVChoice,
                 tokens_per_block: int, device: str, dtype: DtypeChoice, draft: Path | None = None, draft_len: int = 3,
                 draft_kv: DraftKVChoice = DraftKVChoice.SEPARATE, tp: int = 1,
                 weights_dtype: WeightsDtypeChoice = WeightsDtypeChoice.AUTO) -> None:
    prompts = _prompts(prompt or [], prompt_ids or [], chat)
    if not model.is_dir():
        raise M3BenchError(f"model directory {model} does not exist")
    from m3bench.runtime.fit_check import EngineFit, check_engine_fits
    from m3bench.runtime.llm import LLM, SamplingParams

    spec = _spec_kwargs(draft, draft_len, draft_kv)
    check_engine_fits(model, EngineFit(device, _dtype(dtype, device), kv_cache_dtype.value, tp,  # memory plan
                                       tokens_per_block=tokens_per_block, weights_dtype=weights_dtype.value,
                                       draft_dir=draft))
    llm = LLM(model, device=device, dtype=_dtype(dtype, device), kv_cache_dtype=kv_cache_dtype.value,
              tokens_per_block=tokens_per_block, load_format=load_format.value, seed=seed or 0,
              tensor_parallel_size=tp, weights_dtype=weights_dtype.value, **spec)
    if chat:
        prompts = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            logprobs=logprobs or 0)
    for out in llm.generate(prompts, params):
        _print(out, as_json, logprobs)
    if draft is not None:
        _print_acceptance(llm)
    llm.shutdown()  # tensor-parallel workers (also stopped at exit, or on an error)


def _spec_kwargs(draft: Path | None, draft_len: int, draft_kv: DraftKVChoice) -> dict:
    if draft is None:
        return {}
    if not draft.is_dir():
        raise M3BenchError(f"draft directory {draft} does not exist")
    return {"speculative_model": draft, "draft_len": draft_len, "draft_kv": draft_kv.value}


def _print_acceptance(llm) -> None:
    """The run's acceptance figures on stderr (docs/measurement.md definitions)."""
    from m3bench.runtime.speculative.stats import EmptySampleError

    try:
        s = llm.spec_stats()
    except EmptySampleError:
        print("[speculation: no step carried a draft]", file=sys.stderr)
        return
    per_pos = " ".join(f"{r:.3f}" for r in s.per_position_rate)
    note = " (synthetic acceptance: not the model's tokens)" if s.synthetic else ""
    print(f"[acceptance rate {s.acceptance_rate:.3f}, acceptance length {s.acceptance_length:.3f}, per position "
          f"{per_pos}, drafts {s.drafts}, accepted {s.accepted}/{s.proposed}{note}]", file=sys.stderr)


def _prompts(texts: list[str], id_lists: list[str], chat: bool) -> list:
    if not texts and not id_lists:
        raise M3BenchError("give at least one --prompt or --prompt-ids")
    if chat and id_lists:
        raise M3BenchError("--chat applies to --prompt text, not --prompt-ids")
    return [*texts, *(parse_prompt_ids(s) for s in id_lists)]


def _dtype(choice: DtypeChoice, device: str) -> str:
    if choice is DtypeChoice.AUTO:
        return "bfloat16" if device.startswith("cuda") else "float32"
    return choice.value


def _print(out, as_json: bool, top_n: int | None) -> None:
    if as_json:
        rec = {"token_ids": out.token_ids, "text": out.text, "logprobs": out.logprobs,
               "finish_reason": out.finish_reason}
        if getattr(out, "spec", None) is not None:
            rec["spec"] = out.spec.to_dict()
        if top_n:
            rec["top_logprobs"] = [[[t, lp] for t, lp in top] for top in out.top_logprobs]
        print(json.dumps(rec))
        return
    print(out.text)
    print(f"[{len(out.token_ids)} tokens, finish {out.finish_reason}]", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
