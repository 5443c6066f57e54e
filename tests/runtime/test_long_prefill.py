"""Long prompts: max_model_len up to max_position_embeddings (and the KV pool), and a chunked prefill with
MSA block selection active equal to the unchunked one (fp64, the torch backend)."""

import dataclasses

import pytest
import torch

from m3bench.runtime import LLM, SamplingParams
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.errors import InputError
from m3bench.runtime.engine_builder import context_length

PROMPT_LEN = 1500  # 12 MSA blocks of 128 tokens: top-2 selection (plus the local block) leaves most out


def test_context_length_limits():
    assert context_length(None, 1 << 20, 8192, 128) == 1 << 20  # M3: 1,048,576 positions, a big pool
    assert context_length(None, 1 << 20, 64, 128) == 64 * 128  # the pool is the limit
    assert context_length(131072, 1 << 20, 4096, 128) == 131072
    assert context_length(1 << 20, 1 << 20, 8192, 128) == 1 << 20  # up to max_position_embeddings
    assert context_length(None, 4096, 64, 128, lookahead=6) == 4090
    with pytest.raises(InputError, match="max_position_embeddings 1048576"):
        context_length((1 << 20) + 1, 1 << 20, 1 << 14, 128)
    with pytest.raises(InputError, match="pool has 64"):
        context_length(131072, 1 << 20, 64, 128)
    with pytest.raises(InputError, match="lookahead"):
        context_length(4096, 4096, 64, 128, lookahead=6)


@pytest.fixture(scope="module")
def tiny_cfg(tmp_path_factory):
    from m3bench.runtime.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=2)
    return ckpt, ModelConfig.from_pretrained(ckpt)


def test_llm_takes_max_model_len(tiny_cfg):
    ckpt, cfg = tiny_cfg
    llm = LLM(str(ckpt), load_format="dummy", num_kv_blocks=40, max_model_len=cfg.max_position_embeddings)
    assert llm.max_model_len == cfg.max_position_embeddings == 4096
    short = LLM(str(ckpt), load_format="dummy", num_kv_blocks=40, max_model_len=300)
    assert short.max_model_len == 300
    with pytest.raises(InputError, match="max_model_len 300"):
        short.generate([[5] * 300], SamplingParams(max_tokens=1))
    with pytest.raises(InputError, match="max_position_embeddings"):
        LLM(str(ckpt), load_format="dummy", num_kv_blocks=40, max_model_len=4097)


def _prompt_logprobs(cfg, max_num_tokens: int, prompt: list[int]) -> tuple[list[float], list[int]]:
    llm = LLM(None, config=cfg, load_format="dummy", seed=3, dtype="float64", attention_backend="torch",
              num_kv_blocks=16, max_num_tokens=max_num_tokens, enable_prefix_caching=False)
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=4, prompt_logprobs=0, ignore_eos=True,
                                                  detokenize=False))
    return out.prompt_logprobs, out.token_ids


def test_chunked_long_prefill_equals_unchunked_with_msa_selection(tiny_cfg):
    _, cfg = tiny_cfg
    assert cfg.msa is not None and PROMPT_LEN > (cfg.msa.topk_blocks + 2) * cfg.msa.block_size
    prompt = torch.randint(3, cfg.vocab_size, (PROMPT_LEN,), generator=torch.Generator().manual_seed(11)).tolist()
    whole, whole_ids = _prompt_logprobs(cfg, 2048, prompt)
    chunked, chunked_ids = _prompt_logprobs(cfg, 320, prompt)  # 5 chunks, boundaries inside MSA blocks
    assert len(whole) == PROMPT_LEN - 1 and chunked_ids == whole_ids
    assert max(abs(a - b) for a, b in zip(whole, chunked)) < 1e-9
    # the selection matters here: with every block selected (dense causal) the late positions differ
    dense_cfg = dataclasses.replace(cfg, msa=dataclasses.replace(cfg.msa, topk_blocks=64))
    dense, _ = _prompt_logprobs(dense_cfg, 2048, prompt)
    assert max(abs(a - b) for a, b in zip(whole[1000:], dense[1000:])) > 1e-6
