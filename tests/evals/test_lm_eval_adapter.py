"""The `m3bench` lm-eval model: strict model_args, registration, rolling loglikelihood, generation kwargs."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from m3bench.evals.lm_eval_adapter import M3BenchLM, M3BenchLMArgs, cut_at_stops  # noqa: E402
from m3bench.runtime.engine_config import DType  # noqa: E402
from m3bench.runtime.errors import InputError  # noqa: E402


def test_model_args_are_parsed_strictly():
    args = M3BenchLMArgs.parse({"pretrained": "~/ckpt", "dtype": "bfloat16", "max_batch_size": "8",
                                "enable_prefix_caching": "false", "gpu_memory_utilization": 0.5,
                                "batch_size": "auto", "device": None})
    assert args.engine.model == Path("~/ckpt").expanduser() and args.engine.dtype is DType.BFLOAT16
    assert args.engine.max_batch_size == 8 and args.engine.enable_prefix_caching is False
    assert args.engine.device == "auto" and args.engine.gpu_memory_utilization == 0.5
    with pytest.raises(InputError, match=r"unknown m3bench model_args \['temprature'\]"):
        M3BenchLMArgs.parse({"pretrained": "x", "temprature": 1})
    with pytest.raises(InputError, match="pretrained=DIR"):
        M3BenchLMArgs.parse({"dtype": "float32"})
    with pytest.raises(InputError, match="max_batch_size='many'"):
        M3BenchLMArgs.parse({"pretrained": "x", "max_batch_size": "many"})
    with pytest.raises(InputError, match="cuda_graphs"):
        M3BenchLMArgs.parse({"pretrained": "x", "cuda_graphs": "maybe"})


def test_registered_as_m3bench():
    assert get_model("m3bench") is M3BenchLM


def test_missing_model_dir_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="not found"):
        M3BenchLM(pretrained=str(tmp_path / "absent"))


def test_cut_at_stops_is_lm_evals_rule():
    assert cut_at_stops("42\n\nQuestion: next", ["Question:", "<|im_end|>"]) == "42\n\n"
    assert cut_at_stops("a<|im_end|>b Question:", ["Question:", "<|im_end|>"]) == "a"


@pytest.fixture(scope="module")
def lm(smollm2_dir) -> M3BenchLM:
    import torch

    torch.set_num_threads(1)
    return M3BenchLM(pretrained=str(smollm2_dir), max_length=8, max_batch_size=8)


@pytest.fixture(scope="module")
def hflm(smollm2_dir):
    """lm-eval's own HF model, the reference, with the same 8-token window."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(smollm2_dir), dtype="float32", max_length=8, batch_size=2, device="cpu")


def test_rolling_loglikelihood_matches_lm_eval_hf(lm, hflm):
    """Windows of 8 tokens force several rolling chunks."""
    ref = hflm
    texts = ["The quick brown fox jumps over the lazy dog while seven birds sing over quiet hills near "
             "old stone bridges and rivers.", "Short text."]
    reqs = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    got, want = lm.loglikelihood_rolling(reqs), ref.loglikelihood_rolling(reqs)
    assert len(lm.tok_encode(texts[0])) > 2 * 8
    assert got == pytest.approx(want, abs=0.1)  # bf16 KV cache on the runtime side, summed over ~30 tokens
    assert all(g < 0 for g in got)


def test_loglikelihood_with_empty_context_uses_the_bos_prefix(lm, hflm):
    reqs = [Instance("loglikelihood", {}, ("", "Hello world"), 0), Instance("loglikelihood", {}, ("Hi ", "there"), 1)]
    assert lm.prefix_token_id == hflm.prefix_token_id == lm.tokenizer.bos_token_id
    got, want = lm.loglikelihood(reqs), hflm.loglikelihood(reqs)
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=0.1)
    assert [g[1] for g in got] == [w[1] for w in want]


def test_generation_kwargs(lm):
    reqs = [Instance("generate_until", {}, ("Count: 1, 2, 3,", {"until": [","], "max_gen_toks": 6}), 0),
            Instance("generate_until", {}, ("Count: 1, 2, 3,", {"until": ["\n\n"], "do_sample": False,
                                                                 "max_gen_toks": 6}), 1)]
    cut, free = lm.generate_until(reqs)
    assert "," not in cut and free.startswith(cut)
    bad = Instance("generate_until", {}, ("x", {"until": ["\n"], "num_beams": 4}), 0)
    with pytest.raises(InputError, match="num_beams"):
        lm.generate_until([bad])


def test_chat_template_hooks(lm):
    history = [{"role": "user", "content": "Hi"}]
    assert lm.apply_chat_template(history) == lm.tokenizer.apply_chat_template(
        history, tokenize=False, add_generation_prompt=True)
    assert "/" not in lm.tokenizer_name and lm.chat_template(True) == lm.tokenizer.chat_template
