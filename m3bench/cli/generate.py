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
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli import validate
from m3bench.cli.engine_flags import ENGINE, EngineFlags, engine_flags
from m3bench.cli.errors import M3BenchError, user_errors


def parse_prompt_ids(text: str) -> list[int]:
    """'1, 2,3' -> [1, 2, 3]; anything else is an input error."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise M3BenchError(f"--prompt-ids wants comma-separated non-negative integers, got {text!r}")
    return [int(p) for p in parts]


@engine_flags
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
    engine: EngineFlags = ENGINE,
) -> None:
    """Generate continuations of --prompt / --prompt-ids with m3bench's engine."""
    run_generate(**locals())


@user_errors
def run_generate(model: Path, prompt, prompt_ids, chat: bool, max_tokens: int, temperature: float, top_p: float,
                 top_k: int, seed, logprobs, as_json: bool, engine: EngineFlags = ENGINE) -> None:
    cfg = engine.config(model, seed=seed or 0)  # bad engine flags: exit 2 before anything loads
    prompts = _prompts(prompt or [], prompt_ids or [], chat)
    validate.finite(temperature, "--temperature")
    validate.finite(top_p, "--top-p")
    if not model.is_dir():
        raise M3BenchError(f"model directory {model} does not exist")
    from m3bench.runtime.llm import LLM, SamplingParams

    llm = LLM.from_config(cfg)
    if chat:
        prompts = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    _check_against_model(llm, prompts, max_tokens, logprobs)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            logprobs=logprobs or 0)
    for out in llm.generate(prompts, params):
        _print(out, as_json, logprobs)
    if cfg.draft is not None:
        _print_acceptance(llm)
    llm.shutdown()  # tensor-parallel workers (also stopped at exit, or on an error)


def _check_against_model(llm, prompts: list, max_tokens: int, logprobs: int | None) -> None:
    """--logprobs within the vocabulary, each prompt plus --max-tokens within the context (before any step)."""
    vocab = llm.config.vocab_size
    if logprobs is not None and logprobs > vocab:
        raise M3BenchError(f"--logprobs {logprobs} exceeds the vocabulary of {vocab} tokens")
    for p in prompts:
        n = len(p) if isinstance(p, list) else len(llm.tokenizer.encode(p)) if llm.tokenizer is not None else 1
        validate.context_fits(n, max_tokens, llm.max_model_len)


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
    if any(not t for t in texts):
        raise M3BenchError("--prompt is empty: give some text")
    return [*texts, *(parse_prompt_ids(s) for s in id_lists)]


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
