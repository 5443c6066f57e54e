"""`m3bench serve` /v1/completions with echo + logprobs (vLLM's prompt logprobs), through the openai client."""

import pytest
import torch
from server_thread import serving

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.runtime.llm import LLM
    from m3bench.bench.server import ServerConfig
    from m3bench.runtime.async_llm import AsyncLLM
    from m3bench.runtime.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0)
    llm = LLM.from_config(EngineConfig(str(ckpt), num_kv_blocks=24, max_batch_size=8, max_num_tokens=16))  # chunked prefill
    engine = AsyncLLM(llm)
    with serving(engine, ServerConfig("tiny", llm.max_model_len)) as url:
        yield {"url": url, "llm": llm}
    engine.shutdown()


def _client(served):
    return openai.OpenAI(base_url=served["url"] + "/v1", api_key="none", max_retries=0)


def _reference(llm, ids):
    from m3bench.runtime import contiguous

    return torch.log_softmax(contiguous.prefill_logits(llm.model, ids).double(), -1)


PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."


def test_echo_max_tokens_zero_scores_the_prompt(served):
    llm, tok = served["llm"], served["llm"].tokenizer
    ids = tok.encode(PROMPT)
    r = _client(served).completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2,
                                           temperature=0)
    choice = r.choices[0]
    lp = choice.logprobs
    assert choice.text == PROMPT and r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    lsm = _reference(llm, ids)
    assert lp.token_logprobs[1:] == pytest.approx([lsm[r, ids[r + 1]].item() for r in range(len(ids) - 1)], abs=1e-4)
    for r, top in enumerate(lp.top_logprobs[1:]):
        best = lsm[r].topk(2).values.tolist()
        assert len(top) in (2, 3) and sorted(top.values(), reverse=True)[:2] == pytest.approx(best, abs=1e-4)
        assert max(top.values()) == pytest.approx(best[0], abs=1e-4)
    # text_offset: each token's text starts there in the echoed prompt
    pieces = [tok.decode(ids[:i + 1], skip_special_tokens=True) for i in range(len(ids))]
    assert lp.text_offset == [len(tok.decode(ids[:i], skip_special_tokens=True)) for i in range(len(ids))]
    assert pieces[-1] == PROMPT and lp.text_offset == sorted(lp.text_offset)


def test_echo_with_generation_appends_the_generated_tokens(served):
    ids = served["llm"].tokenizer.encode(PROMPT)
    c = _client(served)
    r = c.completions.create(model="tiny", prompt=ids, max_tokens=3, echo=True, logprobs=1, temperature=0,
                             extra_body={"ignore_eos": True})
    plain = c.completions.create(model="tiny", prompt=ids, max_tokens=3, logprobs=1, temperature=0,
                                 extra_body={"ignore_eos": True})
    lp, gen = r.choices[0].logprobs, plain.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 3 and lp.tokens[len(ids):] == gen.tokens
    assert lp.token_logprobs[len(ids):] == pytest.approx(gen.token_logprobs, abs=1e-5)
    echo_len = len(r.choices[0].text) - len(plain.choices[0].text)
    assert r.choices[0].text.endswith(plain.choices[0].text)
    assert lp.text_offset[len(ids):] == [echo_len + o for o in gen.text_offset]
    zero = c.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    assert zero.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[:len(ids)], abs=1e-5)


def test_bad_echo_requests_stay_4xx(served):
    c = _client(served)
    with pytest.raises(openai.BadRequestError):
        list(c.completions.create(model="tiny", prompt="a b", max_tokens=1, echo=True, logprobs=1, stream=True))
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny", prompt="a b", max_tokens=0, echo=True, logprobs=99)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny", prompt="a b", max_tokens=-1, echo=True, logprobs=1)
