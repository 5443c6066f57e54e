"""load_format="dummy" with speculative_model=DIR: only DIR/config.json is read, the draft is random."""

import json

import pytest

from m3bench.runtime import LLM, SamplingParams
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.errors import CheckpointError
from m3bench.runtime.speculative.tiny_draft import tiny_draft_config


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("target"), seed=3)


def _config_only(dest, target, draft_vocab_size=None):
    dest.mkdir()
    cfg = tiny_draft_config(ModelConfig.from_pretrained(target), draft_vocab_size)
    (dest / "config.json").write_text(json.dumps(cfg.to_dict()))
    return dest


def _llm(target, **kw):
    return LLM(target, load_format="dummy", num_kv_blocks=16, tokens_per_block=16, seed=5, **kw)


PROMPTS = [[11, 12, 13, 14, 15, 16, 17], [40, 41, 42]]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize("draft_vocab", [None, 512])
def test_dummy_draft_from_config_only_is_lossless(target, tmp_path, draft_vocab):
    draft_dir = _config_only(tmp_path / "draft", target, draft_vocab)
    plain = [o.token_ids for o in _llm(target).generate(PROMPTS, GREEDY)]
    llm = _llm(target, speculative_model=draft_dir, draft_len=3)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain  # greedy verification: the draft never changes the output
    stats = llm.spec_stats()
    assert stats.drafts > 0 and stats.proposed > 0 and not stats.synthetic
    assert (llm.draft.d2t is not None) == (draft_vocab is not None)


def test_dummy_draft_is_seeded_and_auto_needs_weights(target, tmp_path):
    draft_dir = _config_only(tmp_path / "draft", target)
    a = _llm(target, speculative_model=draft_dir).draft
    b = _llm(target, speculative_model=draft_dir).draft
    wa, wb = dict(a.named_parameters()), dict(b.named_parameters())
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    assert wa["fc.weight"].std() > 0  # random, not zeros
    with pytest.raises(CheckpointError):
        LLM(target, num_kv_blocks=16, tokens_per_block=16, speculative_model=draft_dir)  # auto: weights needed


def test_synthetic_acceptance_on_a_dummy_draft(target, tmp_path):
    draft_dir = _config_only(tmp_path / "draft", target)
    llm = _llm(target, speculative_model=draft_dir, draft_len=3, synthetic_acceptance_length=3.0)
    llm.generate(PROMPTS, SamplingParams(max_tokens=40, ignore_eos=True))
    stats = llm.spec_stats()
    assert stats.synthetic and stats.acceptance_length == pytest.approx(3.0, abs=0.15)
