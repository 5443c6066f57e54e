"""The `openai` backend against a real HTTP stub server on 127.0.0.1 (a random free port, one per test)."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from m3bench.evals.backends.base import GenRequest, ScoreRequest, ScoreResult
from m3bench.evals.backends.openai import (
    BackendRequestError,
    OpenAIBackend,
    OpenAIConfig,
    continuation_start_from_offsets,
    score_from_text_offsets,
    score_from_token_count,
)
from m3bench.runtime.errors import InputError

# ----------------------------------------------------------------------------- a fake echo model


def pieces(text: str) -> list[tuple[int, str]]:
    """Word pieces with their char offsets: ' word' keeps its leading space, as BPE does."""
    return [(m.start(), m.group()) for m in re.finditer(r"\s*\S+|\s+$", text)]


def piece_logprob(i: int, piece: str) -> float:
    return -0.1 * (i + 1) - 0.01 * len(piece)


def piece_top(i: int, piece: str) -> dict[str, float]:
    lp = piece_logprob(i, piece)
    return {piece: lp, "<alt>": lp + (0.5 if i % 3 == 0 else -1.0)}  # positions 0, 3, 6.. are not greedy


def echo_completion(prompt: str, max_tokens: int) -> dict[str, Any]:
    toks = pieces(prompt)
    lps: list[Any] = [None] + [piece_logprob(i, p) for i, (_, p) in enumerate(toks)][1:]
    tops: list[Any] = [None] + [piece_top(i, p) for i, (_, p) in enumerate(toks)][1:]
    offsets, strs = [o for o, _ in toks], [p for _, p in toks]
    if max_tokens:  # the generated token comes after the echo
        offsets, strs, lps, tops = offsets + [len(prompt)], strs + [" Z"], lps + [-3.0], tops + [{" Z": -3.0}]
    text = prompt + (" Z" if max_tokens else "")
    block = {"tokens": strs, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
    return {"choices": [{"index": 0, "text": text, "logprobs": block, "finish_reason": "length"}]}


def expected_score(context: str, continuation: str) -> ScoreResult:
    """Independent reference: the continuation's pieces are those starting at or after len(context)."""
    total, greedy = 0.0, True
    for i, (off, p) in enumerate(pieces(context + continuation)):
        if off >= len(context.rstrip()):
            total += piece_logprob(i, p)
            greedy = greedy and i % 3 != 0
    return ScoreResult(total, greedy)


# ----------------------------------------------------------------------------- the stub server

HANG = object()


class Stub:
    """Serves `/v1/*` by calling `handler(path, body) -> (status, body_or_bytes[, headers])`."""

    def __init__(self, handler: Callable[[str, Any], tuple]):
        self.handler = handler
        self.calls: list[tuple[str, Any, dict]] = []
        self.in_flight = self.max_in_flight = 0
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler_class(self):
        stub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_GET(self):
                stub._serve(self, None)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                stub._serve(self, json.loads(raw))

        return H

    def _serve(self, h: BaseHTTPRequestHandler, body: Any) -> None:
        with self.lock:
            self.calls.append((h.path, body, dict(h.headers)))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            out = self.handler(h.path, body)
            if out is HANG:
                self.release.wait(30)
                return
            status, payload, *rest = out
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            h.send_response(status)
            for k, v in (rest[0] if rest else {}).items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        finally:
            with self.lock:
                self.in_flight -= 1

    def posts(self, path: str) -> list[Any]:
        return [b for p, b, _ in self.calls if p == path]

    def __enter__(self) -> "Stub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def models_or(handler: Callable[[str, Any], tuple]) -> Callable[[str, Any], tuple]:
    """Answer GET /v1/models with one model, everything else with `handler`."""

    def serve(path: str, body: Any) -> tuple:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}
        return handler(path, body)

    return serve


def echo_handler(path: str, body: Any) -> tuple:
    if path == "/v1/completions" and body.get("echo"):
        return 200, echo_completion(body["prompt"], body["max_tokens"])
    if path == "/v1/completions":
        return 200, {"choices": [{"index": 0, "text": " gen:" + body["prompt"][-3:], "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
    if path == "/v1/chat/completions":
        text = "chat:" + body["messages"][-1]["content"]
        return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "length"}], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
    return 404, {"error": "no such path"}


def backend(stub: Stub, **kw: Any) -> OpenAIBackend:
    kw = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 5.0, **kw}
    return OpenAIBackend(OpenAIConfig(base_url=stub.url, **kw))


def collect(run: Callable, requests: list) -> dict[int, Any]:
    out: dict[int, Any] = {}
    run(requests, lambda i, r: out.__setitem__(i, r))
    return out


SCORES = [
    ScoreRequest("The following are questions.\n\nWhat is 2+2?\nA. 3\nB. 4\nAnswer:", " B"),
    ScoreRequest("Question: one two three four five six", " seven eight nine"),
    ScoreRequest("Trailing space context ", "moves"),  # lm-eval: the space belongs to the continuation
]

# ----------------------------------------------------------------------------- parsing, hand-made


def test_score_on_a_hand_made_echo_response():
    body = {"choices": [{"index": 0, "text": "Answer: B C", "logprobs": {
        "tokens": ["Answer", ":", " B", " C", " X"],
        "token_logprobs": [None, -0.25, -1.5, -0.75, -9.0],
        "top_logprobs": [None, {":": -0.25}, {" B": -1.5, " A": -2.0}, {" C": -0.75, " D": -0.5}, {" X": -9.0}],
        "text_offset": [0, 6, 7, 9, 11],
    }}]}
    got = score_from_text_offsets(body, "Answer: B C", boundary_char=7)
    assert got.logprob == pytest.approx(-1.5 - 0.75)  # " X" (offset 11 = len(prompt)) is the generated token
    assert got.is_greedy is False  # " D" beats " C"
    only_b = score_from_text_offsets(body, "Answer: B", boundary_char=7)
    assert only_b == ScoreResult(-1.5, True)
    assert score_from_token_count(body, n_context=2, n_prompt=4) == ScoreResult(-2.25, False)


def test_continuation_starts_at_the_token_holding_its_first_char():
    offsets = [0, 6, 9, 12]  # "Answer", ":A", ..., the last token ends at 15: char 7 lies inside token 1
    assert continuation_start_from_offsets(offsets, 6, 15) == 1
    assert continuation_start_from_offsets(offsets, 7, 15) == 1
    assert continuation_start_from_offsets(offsets, 9, 15) == 2
    assert continuation_start_from_offsets(offsets, 13, 15) == 3
    assert continuation_start_from_offsets(offsets, 15, 15) == 4  # nothing left to score


def test_malformed_logprobs_are_rejected_by_the_parser():
    from m3bench.evals.backends.openai import MalformedResponse

    with pytest.raises(MalformedResponse):
        score_from_text_offsets({"choices": [{"text": "x"}]}, "a b", 1)
    bad_top = echo_completion("a b c", 0)
    bad_top["choices"][0]["logprobs"]["top_logprobs"][2] = None
    with pytest.raises(MalformedResponse, match="top_logprobs"):
        score_from_text_offsets(bad_top, "a b c", 3)


# ----------------------------------------------------------------------------- over HTTP


def test_scores_over_http_match_the_reference():
    with Stub(models_or(echo_handler)) as stub:
        got = collect(backend(stub).score, SCORES)
        posts = stub.posts("/v1/completions")
    for i, req in enumerate(SCORES):
        want = expected_score(req.context, req.continuation)
        assert got[i].logprob == pytest.approx(want.logprob) and got[i].is_greedy == want.is_greedy
    assert all(p["echo"] and p["logprobs"] == 1 and p["max_tokens"] == 0 and p["model"] == "stub-model" for p in posts)
    assert sorted(p["prompt"] for p in posts) == sorted(r.context + r.continuation for r in SCORES)


def test_server_refusing_max_tokens_zero_falls_back_to_one():
    def refuse_zero(path: str, body: Any) -> tuple:
        if body.get("max_tokens") == 0:
            return 400, {"error": {"message": "max_tokens must be at least 1"}}
        return echo_handler(path, body)

    with Stub(models_or(refuse_zero)) as stub:
        b = backend(stub, max_concurrency=1)
        got = collect(b.score, SCORES)
    for i, req in enumerate(SCORES):
        assert got[i].logprob == pytest.approx(expected_score(req.context, req.continuation).logprob)
    assert b.describe()["score_max_tokens"] == 1


def test_raw_prompts_and_chat_go_to_their_endpoints():
    reqs = [
        GenRequest(prompt="Question: 1+1?\nAnswer:", max_tokens=5, stop=("Question:",), seed=3),
        GenRequest(messages=({"role": "user", "content": "hi"},), max_tokens=4,
                   chat_template_kwargs=(("enable_thinking", False),)),
    ]
    with Stub(models_or(echo_handler)) as stub:
        got = collect(backend(stub).generate, reqs)
        comp, chat = stub.posts("/v1/completions")[0], stub.posts("/v1/chat/completions")[0]
    assert got[0].text == " gen:er:" and got[0].finish_reason == "stop" and got[0].num_output_tokens == 2
    assert got[1].text == "chat:hi" and got[1].finish_reason == "length" and got[1].num_prompt_tokens == 9
    assert comp["stop"] == ["Question:"] and comp["seed"] == 3 and comp["temperature"] == 0.0
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}


def test_model_and_api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("M3BENCH_API_KEY", "sk-m3")
    with Stub(models_or(echo_handler)) as stub:
        b = backend(stub)
        collect(b.generate, [GenRequest(prompt="abc")])
        explicit = backend(stub, api_key="sk-flag", model="named")
        collect(explicit.generate, [GenRequest(prompt="abc")])
        headers = [h for p, _, h in stub.calls if p == "/v1/completions"]
        models = [body["model"] for body in stub.posts("/v1/completions")]
    assert b.model == "stub-model" and models == ["stub-model", "named"]
    assert headers[0]["Authorization"] == "Bearer sk-m3" and headers[1]["Authorization"] == "Bearer sk-flag"
    assert "sk-" not in json.dumps(b.describe())


def test_5xx_and_429_are_retried_until_success():
    seen: dict[str, int] = {}

    def flaky(path: str, body: Any) -> tuple:
        n = seen[body["prompt"]] = seen.get(body["prompt"], 0) + 1
        if n == 1:
            return 503, b"overloaded"
        if n == 2:
            return 429, {"error": "slow down"}, {"Retry-After": "0.01"}
        return echo_handler(path, body)

    with Stub(models_or(flaky)) as stub:
        got = collect(backend(stub, max_retries=2).generate, [GenRequest(prompt=f"p{i}") for i in range(4)])
    assert [got[i].text for i in range(4)] == [f" gen:p{i}" for i in range(4)]
    assert all(n == 3 for n in seen.values())


def test_persistent_5xx_fails_that_item_only():
    def one_broken(path: str, body: Any) -> tuple:
        return (500, b"boom") if body["prompt"] == "bad" else echo_handler(path, body)

    done: dict[int, Any] = {}
    with Stub(models_or(one_broken)) as stub:
        with pytest.raises(BackendRequestError, match=r"1 of 3 requests failed: item 1: .*HTTP 500") as e:
            backend(stub, max_retries=2).generate(
                [GenRequest(prompt="ok1"), GenRequest(prompt="bad"), GenRequest(prompt="ok2")],
                lambda i, r: done.__setitem__(i, r))
        assert len(stub.posts("/v1/completions")) == 2 + 3
    assert sorted(done) == [0, 2] and list(e.value.failures) == [1]
    assert isinstance(e.value, InputError)


def test_hung_connection_hits_the_timeout():
    def hang(path: str, body: Any) -> tuple:
        return HANG if body["prompt"] == "hang" else echo_handler(path, body)

    done: dict[int, Any] = {}
    with Stub(models_or(hang)) as stub:
        t0 = time.monotonic()
        with pytest.raises(BackendRequestError, match="item 0: ReadTimeout.*after 2 attempts"):
            backend(stub, timeout_s=0.3, max_retries=1).generate(
                [GenRequest(prompt="hang"), GenRequest(prompt="fine")], lambda i, r: done.__setitem__(i, r))
        elapsed_s = time.monotonic() - t0
    assert 0.6 <= elapsed_s < 5.0 and list(done) == [1]


def test_malformed_json_is_a_clear_error_after_retries():
    with Stub(models_or(lambda path, body: (200, b"{'choices': [oops"))) as stub:
        with pytest.raises(BackendRequestError, match="item 0: MalformedResponse: body is not JSON.*after 3 attempts"):
            backend(stub, max_retries=2).score(SCORES[:1], lambda i, r: None)
        assert len(stub.posts("/v1/completions")) == 3


def test_malformed_json_once_then_good_recovers():
    seen = []

    def once(path: str, body: Any) -> tuple:
        seen.append(1)
        return (200, b"not json") if len(seen) == 1 else echo_handler(path, body)

    with Stub(models_or(once)) as stub:
        got = collect(backend(stub).score, SCORES[:1])
    assert got[0].logprob == pytest.approx(expected_score(SCORES[0].context, SCORES[0].continuation).logprob)


def test_client_errors_are_not_retried():
    with Stub(models_or(lambda path, body: (404, {"error": "model not found"}))) as stub:
        with pytest.raises(BackendRequestError, match="HTTP 404"):
            backend(stub).generate([GenRequest(prompt="x")], lambda i, r: None)
        assert len(stub.posts("/v1/completions")) == 1


def test_concurrency_cap_is_respected():
    def slow(path: str, body: Any) -> tuple:
        time.sleep(0.05)
        return echo_handler(path, body)

    with Stub(models_or(slow)) as stub:
        got = collect(backend(stub, max_concurrency=3).generate, [GenRequest(prompt=f"q{i}") for i in range(12)])
    assert len(got) == 12 and 2 <= stub.max_in_flight <= 3


def test_unreachable_server_is_an_input_error():
    with Stub(models_or(echo_handler)) as stub:
        url = stub.url
    with pytest.raises(InputError, match="cannot list models"):
        OpenAIBackend(OpenAIConfig(base_url=url, max_retries=1, backoff_base_s=0.01, timeout_s=1.0))


def test_tokenizer_free_limits_are_input_errors():
    with Stub(models_or(echo_handler)) as stub:
        b = backend(stub)
        with pytest.raises(InputError, match="--tokenizer"):
            b.tokenize("hello")
        with pytest.raises(InputError, match="--tokenizer"):
            b.apply_chat_template([{"role": "user", "content": "hi"}])
        with pytest.raises(InputError, match="empty context"):
            b.score([ScoreRequest("", "hello")], lambda i, r: None)
    with pytest.raises(InputError, match="base_url"):
        OpenAIConfig(base_url="localhost:8000")


def ids_echo_handler(path: str, body: Any) -> tuple:
    """Echo of a token-id prompt: position i has logprob -0.1 * i, always the top-1."""
    ids = body["prompt"]
    lps: list[Any] = [None] + [-0.1 * i for i in range(1, len(ids))]
    tops: list[Any] = [None] + [{str(t): -0.1 * i} for i, t in enumerate(ids) if i]
    block = {"tokens": [str(t) for t in ids], "token_logprobs": lps, "top_logprobs": tops}
    return 200, {"choices": [{"index": 0, "text": "", "logprobs": block, "finish_reason": "length"}]}


def test_local_tokenizer_sends_ids_split_as_lm_eval(smollm2_dir):
    from transformers import AutoTokenizer

    from m3bench.evals.backends.hf import split_pair

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    reqs = SCORES + [ScoreRequest("", "Hello world")]
    with Stub(models_or(ids_echo_handler)) as stub:
        b = backend(stub, tokenizer=smollm2_dir)
        got = collect(b.score, reqs)
        prompts = sorted(p["prompt"] for p in stub.posts("/v1/completions"))
        assert b.tokenize("Hello") == tok.encode("Hello", add_special_tokens=False)
        assert b.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("assistant\n")
    pairs = [split_pair(tok, r.context, r.continuation) for r in reqs]
    assert prompts == sorted(ctx + cont for ctx, cont in pairs)
    for i, (ctx, cont) in enumerate(pairs):
        want = sum(-0.1 * j for j in range(len(ctx), len(ctx) + len(cont)))
        assert got[i] == ScoreResult(pytest.approx(want), True)
