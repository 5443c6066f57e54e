"""The `hf` reference backend on SmolLM2-135M against plain per-item torch references."""

from __future__ import annotations

import random

import pytest

from m3bench.evals.backends.base import GenRequest, ScoreRequest
from m3bench.evals.backends.hf import HFBackend, HFConfig, cut_at_stop, split_pair
from m3bench.runtime.errors import InputError

torch = pytest.importorskip("torch")
WORDS = "the cat sat on a mat while seven blue birds sang over quiet hills near old stone bridges".split()


@pytest.fixture(scope="module")
def hf(smollm2_dir) -> HFBackend:
    torch.set_num_threads(1)
    return HFBackend(HFConfig(model_dir=smollm2_dir, batch_size=3))


def random_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize()


def reference_score(hf: HFBackend, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    """One unbatched forward, log-softmax in float64."""
    ids = torch.tensor([ctx + cont])
    with torch.inference_mode():
        logits = hf.model(input_ids=ids).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)[len(ctx) - 1 : -1]
    target = torch.tensor(cont)
    return logp.gather(1, target[:, None]).sum().item(), bool((logp.argmax(-1) == target).all())


def reference_greedy(hf: HFBackend, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by a full forward per step (no KV cache, no batching)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(hf.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def collect(run, requests) -> dict:
    out: dict = {}
    run(requests, lambda i, r: out.__setitem__(i, r))
    return out


def test_split_pair_moves_trailing_spaces(hf):
    tok = hf.tokenizer
    ctx, cont = split_pair(tok, "Answer: ", "B")
    assert tok.decode(ctx) == "Answer:" and tok.decode(cont) == " B"
    assert split_pair(tok, "Answer:", " B") == (ctx, cont)
    assert split_pair(tok, "", "Hello") == ([tok.bos_token_id], tok.encode("Hello", add_special_tokens=False))


def test_batched_scores_match_per_item_float64(hf):
    rng = random.Random(7)
    reqs = [ScoreRequest(random_text(rng, rng.randint(3, 14)), " " + random_text(rng, rng.randint(1, 4)))
            for _ in range(7)]
    got = collect(hf.score, reqs)
    for i, r in enumerate(reqs):
        want_lp, want_greedy = reference_score(hf, *split_pair(hf.tokenizer, r.context, r.continuation))
        assert got[i].logprob == pytest.approx(want_lp, abs=2e-4)
        assert got[i].is_greedy == want_greedy


def test_greedy_continuation_is_greedy(hf):
    ctx = "The capital of France is"
    ids = hf.tokenize(ctx)
    greedy_text = hf.tokenizer.decode(reference_greedy(hf, ids, 3))
    got = collect(hf.score, [ScoreRequest(ctx, greedy_text), ScoreRequest(ctx, " purple elephants")])
    assert got[0].is_greedy and not got[1].is_greedy
    assert got[0].logprob > got[1].logprob


def test_batched_greedy_generation_matches_reference(hf):
    rng = random.Random(3)
    prompts = [random_text(rng, rng.randint(2, 9)) for _ in range(4)]
    got = collect(hf.generate, [GenRequest(prompt=p, max_tokens=6) for p in prompts])
    for i, p in enumerate(prompts):
        want = reference_greedy(hf, hf.tokenize(p), 6)
        if hf.tokenizer.eos_token_id in want:
            want = want[: want.index(hf.tokenizer.eos_token_id)]
        assert got[i].text == hf.tokenizer.decode(want, skip_special_tokens=True)
        assert got[i].num_prompt_tokens == len(hf.tokenize(p))


def test_stop_strings_cut_the_text(hf):
    prompt = "Count: 1, 2, 3, 4,"
    free = collect(hf.generate, [GenRequest(prompt=prompt, max_tokens=8)])[0]
    assert free.finish_reason == "length" and free.num_output_tokens == 8
    stop = free.text.strip()[:1]  # a character the greedy output is known to contain
    cut = collect(hf.generate, [GenRequest(prompt=prompt, max_tokens=8, stop=(stop,))])[0]
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.index(stop)]


def test_chat_requests_use_the_tokenizer_template(hf):
    messages = ({"role": "user", "content": "Say hi."},)
    templated = hf.apply_chat_template(messages)
    assert templated == hf.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    got = collect(hf.generate, [GenRequest(messages=messages, max_tokens=4), GenRequest(prompt=templated, max_tokens=4)])
    assert got[0].text == got[1].text and got[0].num_prompt_tokens == got[1].num_prompt_tokens


def test_bad_requests_are_input_errors(hf, tmp_path):
    with pytest.raises(InputError, match="exactly one"):
        hf.generate([GenRequest()], lambda i, r: None)
    with pytest.raises(InputError, match="no tokens"):
        hf.score([ScoreRequest("Answer:", "")], lambda i, r: None)
    with pytest.raises(InputError, match="not found"):
        HFBackend(HFConfig(model_dir=tmp_path / "absent"))
    assert hf.describe()["dtype"] == "float32"


def test_cut_at_stop_takes_the_earliest():
    assert cut_at_stop("a Question: b</s>", ("</s>", "Question:")) == ("a ", True)
    assert cut_at_stop("plain", ("</s>",)) == ("plain", False)
