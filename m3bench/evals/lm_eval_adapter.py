"""The bundled runtime as an lm-evaluation-harness model, registered as `m3bench`.

    python -m m3bench.evals.lm_eval_adapter --model m3bench --model_args pretrained=DIR,dtype=bfloat16 \\
        --tasks mmlu --num_fewshot 5
    m3bench lm-eval --model DIR --tasks mmlu,gsm8k --limit 50

lm-eval 0.4.x has no plugin discovery for models (its registry is filled from its own MODEL_MAPPING),
so `--model m3bench` works once this module is imported: the `python -m` form above imports it and
then runs lm-eval's own command line. Tested with lm-eval 0.4.13.

Token handling is lm-eval's own (TemplateLM: trailing context spaces move to the continuation,
empty context -> BOS (else EOS) prefix, as HFLM; rolling windows from lm_eval.utils); the engine only sees token ids.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry, register_model
from lm_eval.models.utils import handle_stop_sequences
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from m3bench.runtime.engine_config import FIELD_NAMES, EngineConfig
from m3bench.runtime.errors import InputError

GEN_KWARGS = frozenset({"until", "max_gen_toks", "max_tokens", "temperature", "do_sample", "top_k", "top_p", "seed",
                        "min_tokens"})
LM_EVAL_KEYS = frozenset({"batch_size"})  # passed by lm-eval itself; the engine batches on its own


LM_KEYS = ("max_length", "max_gen_toks", "add_bos_token")  # model_args that are not engine settings
ENGINE_KEYS = tuple(f for f in FIELD_NAMES if f != "model")  # `pretrained` is the engine's model


@dataclass(frozen=True)
class M3BenchLMArgs:
    """model_args of `--model m3bench`: `pretrained=DIR`, any EngineConfig field, and the LM_KEYS; unknown keys
    are an error."""

    engine: EngineConfig
    max_length: int | None = None  # None (and at most): the engine's max_model_len
    max_gen_toks: int = 256
    add_bos_token: bool = False  # lm-eval HFLM's default for causal models

    @classmethod
    def parse(cls, raw: dict[str, Any], engine: EngineConfig | None = None) -> "M3BenchLMArgs":
        """Strict parse of lm-eval's model_args (values arrive as str, int, float or bool); with `engine` given,
        only the LM_KEYS."""
        raw = {k: v for k, v in raw.items() if k not in LM_EVAL_KEYS and v is not None}
        unknown = sorted(set(raw) - ({"pretrained", *ENGINE_KEYS} if engine is None else set()) - set(LM_KEYS))
        if unknown:
            raise InputError(f"unknown m3bench model_args {unknown}; known: {sorted(['pretrained', *ENGINE_KEYS, *LM_KEYS])}")
        if "pretrained" not in raw and engine is None:
            raise InputError("m3bench model_args need pretrained=DIR")
        types = {f.name: str(f.type) for f in dataclasses.fields(EngineConfig)} | {
            f.name: str(f.type) for f in dataclasses.fields(cls)}
        values = {k: _coerce(k, types[k], v) for k, v in raw.items() if k != "pretrained"}
        engine = engine or EngineConfig(model=_coerce("pretrained", "Path", raw["pretrained"]),
                                        **{k: v for k, v in values.items() if k in ENGINE_KEYS})
        return cls(engine, **{k: v for k, v in values.items() if k in LM_KEYS})


def _coerce(name: str, type_name: str, value: Any) -> Any:
    """A model_args value as its field's type (the annotation's text: 'bool | None', 'int', 'Path | None', ...)."""
    try:
        if "Path" in type_name:
            return Path(str(value)).expanduser()
        if "bool" in type_name:
            return _as_bool(value)
        if "int" in type_name:
            return int(value)
        if "float" in type_name:
            return float(value)
        return value if isinstance(value, str) else str(value)
    except ValueError:
        raise InputError(f"model_args {name}={value!r}: not a valid value") from None


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(value)


class M3BenchLM(TemplateLM):
    """lm-eval LM over m3bench.runtime.LLM (`score` for loglikelihoods, `generate` for generate_until)."""

    def __init__(self, engine: Any = None, engine_config: EngineConfig | None = None, **model_args: Any):
        """`engine`: an LLM already built; `engine_config`: build one from it (m3bench lm-eval); else model_args."""
        super().__init__()
        self.args = M3BenchLMArgs.parse(model_args, engine_config)
        self.engine = engine if engine is not None else self._build_engine()
        self.tokenizer = self.engine.tokenizer
        engine_len = int(getattr(self.engine, "max_model_len", self.engine.config.max_position_embeddings))
        self._max_length = min(self.args.max_length or engine_len, engine_len)

    def _build_engine(self) -> Any:
        from m3bench.runtime.llm import LLM

        if not self.args.engine.model.is_dir():
            raise InputError(f"model directory not found: {self.args.engine.model}")
        return LLM.from_config(self.args.engine)

    # --- TemplateLM hooks

    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def prefix_token_id(self) -> int:
        """HFLM's rule: an empty context (and each rolling window's start) is BOS, else EOS."""
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> str:
        return self.args.engine.device

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        special = self.args.add_bos_token if add_special_tokens is None else add_special_tokens
        return list(self.tokenizer.encode(string, add_special_tokens=special))

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # --- loglikelihood

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """requests: ((context, continuation) | None, context_ids, continuation_ids)."""
        pairs = [self._truncate(ctx, cont) for _, ctx, cont in requests]
        results = [(float(lp), bool(greedy)) for lp, greedy in self.engine.score(pairs)]
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def _truncate(self, ctx: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
        """HFLM's rule: keep the last max_length + 1 tokens of context + continuation."""
        keep = (ctx + cont)[-(self.max_length + 1) :]
        return keep[: len(keep) - len(cont)], cont

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        windows: list[tuple[int, tuple[list[int], list[int]]]] = []
        for i, (string,) in enumerate(req.args for req in requests):
            rolling = get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1,
            )
            windows.extend((i, make_disjoint_window(w)) for w in rolling)
        scores = self._loglikelihood_tokens([(None, ctx, cont) for _, (ctx, cont) in windows])
        totals = [0.0] * len(requests)
        for (i, _), (lp, _) in zip(windows, scores):
            totals[i] += lp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # --- generation

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        eos_text = self.tokenizer.decode([self.eot_token_id])
        plans = [self._gen_plan(ctx, dict(kw), eos_text) for ctx, kw in (req.args for req in requests)]
        texts: list[str] = [""] * len(requests)
        groups: dict[Any, list[int]] = {}
        for i, (_, params, _) in enumerate(plans):
            groups.setdefault(params, []).append(i)
        for params, idx in groups.items():
            outs = self.engine.generate([plans[i][0] for i in idx], params)
            for i, out in zip(idx, outs):
                texts[i] = cut_at_stops(out.text, plans[i][2])
        for req, text in zip(requests, texts):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return texts

    def _gen_plan(self, context: str, kwargs: dict[str, Any], eos_text: str) -> tuple[list[int], Any, list[str]]:
        """(prompt ids, SamplingParams, stop strings) of one generate_until request."""
        from m3bench.runtime.sequence import SamplingParams

        unknown = sorted(set(kwargs) - GEN_KWARGS)
        if unknown:
            raise InputError(f"generation kwargs not supported by the m3bench model: {unknown}")
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
        max_tokens = int(kwargs.pop("max_tokens", kwargs.pop("max_gen_toks", self.args.max_gen_toks)))
        temperature = float(kwargs.pop("temperature", 0.0))
        if not kwargs.pop("do_sample", temperature > 0):
            temperature = 0.0
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, stop=tuple(until),
            top_k=int(kwargs.get("top_k", 0)), top_p=float(kwargs.get("top_p", 1.0)),
            seed=kwargs.get("seed"), min_tokens=int(kwargs.get("min_tokens", 0)),
        )
        keep = max(1, self.max_length - max_tokens)  # HFLM: the context is left-truncated to fit
        return self.tok_encode(context)[-keep:], params, until


def _register() -> None:
    """`@register_model("m3bench")`, once: `python -m` runs this file as __main__ and may import it again."""
    if "m3bench" not in model_registry:
        register_model("m3bench")(M3BenchLM)


_register()


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """lm-eval's post-processing: the text before the first occurrence of any stop string."""
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


def main() -> None:
    """lm-eval's own command line, with `--model m3bench` registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
