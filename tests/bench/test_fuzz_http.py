"""Hostile HTTP requests against one `m3bench serve` app: every one a 4xx in OpenAI's error shape, no
exception text, and the server still answering afterwards (issue 14).

One server (tiny checkpoint, API key) serves every case; each case is one request.
"""

from __future__ import annotations

import json

import pytest
from server_thread import serving

httpx = pytest.importorskip("httpx")

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ERROR_KEYS = {"message", "type", "param", "code"}
LEAKS = ("Traceback", "RecursionError", "OverflowError", "TypeError", "KeyError", "AttributeError",
         "ValueError", "File \"")
COMPLETION = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def _raw(body: str | bytes, path: str = "/v1/completions") -> tuple:
    return ("POST", path, body if isinstance(body, bytes) else body.encode(), AUTH)


def _completion(**change) -> tuple:
    body = {**COMPLETION, **change}
    return ("POST", "/v1/completions", json.dumps(body).encode(), AUTH)


def _chat(**change) -> tuple:
    body = {**CHAT, **change}
    return ("POST", "/v1/chat/completions", json.dumps(body).encode(), AUTH)


def _without(path: str, body: dict, field: str) -> tuple:
    return ("POST", path, json.dumps({k: v for k, v in body.items() if k != field}).encode(), AUTH)


BODIES = [b"", b"{", b"null", b"[]", b"5", b'"text"', b"\xff\xfe\x00", b'{"model": "tiny", "prompt": "a"',
          b"model=tiny&prompt=hi", b'{"model": "tiny", "prompt": "a", "max_tokens": 1}}']
DEPTHS = [33, 100, 1000, 100_000]
PROMPTS = [None, 5, [], [[]], [-1], [99_999], [2**70], [1.5], ["a", 1], [[1], ["a"]], {"a": 1}, "", [""],
           ["x"] * 300, [[1, 2]] * 300, True]
INTS = {"max_tokens": [-1, 2**31, 2**70, "x", 5000, 10**10], "top_k": [-1, 2**40, "x"],
        "min_tokens": [-1, 2**40], "seed": [2**70, -(2**70), "x", 1.5, 2**64],
        "logprobs": [21, -1, "x", 2**70]}
FLOATS = {"temperature": [-1, 101, "hot", 1e309], "top_p": [0, 1.5, -1, "x"]}
STOPS = [["s"] * 17, "", "x" * 300, [1], 5, [""], {"a": "b"}]
STOP_IDS = [[-1], [2**40], list(range(65)), "x", [1.5]]
OTHER_COMPLETION = [{"n": 2}, {"stream": "yes"}, {"stream": True, "prompt": ["a", "b"]},
                    {"stream_options": {"include_usage": "x"}}, {"stream_options": {"bogus": 1}},
                    {"stream": True, "echo": True, "logprobs": 1}, {"presence_penalty": 0.5},
                    {"frequency_penalty": 1}, {"user": 5}, {"bogus_field": 1}, {"model": "other"}, {"model": 5},
                    {"min_tokens": 3, "max_tokens": 2}, {"echo": "x"}, {"ignore_eos": "maybe"},
                    {"prompt": "word " * 5000}, {"prompt": list(range(1, 4097)), "max_tokens": 0}]
MESSAGES = [[], "hi", [{}], [{"role": 5, "content": "x"}], [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            [{"role": "user", "content": [5]}], [{"role": "user", "content": {"a": 1}}],
            [{"role": "user", "content": [{"type": "text", "text": _nested(3)}], "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}],
            [{"role": "user", "content": "word " * 5000}], [{"role": "user", "content": 5}], None]
OTHER_CHAT = [{"max_completion_tokens": -1}, {"max_completion_tokens": 2**40}, {"top_logprobs": 21},
              {"logprobs": "x"}, {"chat_template_kwargs": "x"}, {"chat_template_kwargs": {"tokenize": True}},
              {"add_generation_prompt": "x"}, {"seed": 2**70}, {"stop": ["s"] * 17}, {"n": 3}, {"bogus": 1},
              {"model": "other"}, {"temperature": -0.5}, {"top_p": 2}]
ROUTES = [("GET", "/v1/completions"), ("PUT", "/v1/completions"), ("DELETE", "/v1/chat/completions"),
          ("GET", "/nope"), ("POST", "/v1/models"), ("POST", "/v1/chat"), ("GET", "/v1"), ("PATCH", "/health"),
          ("POST", "/metrics"), ("GET", "/v1/models/tiny/extra")]
AUTHS = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer"}, {"Authorization": f"bearer {KEY}"},
         {"Authorization": KEY}, {"X-Api-Key": KEY},
         {"Authorization": f"Bearer {KEY}x"}]


def cases() -> list[tuple[str, tuple]]:
    out = [(f"body{i}", _raw(b)) for i, b in enumerate(BODIES)]
    out += [(f"chat-body{i}", _raw(b, "/v1/chat/completions")) for i, b in enumerate(BODIES[:5])]
    out += [(f"depth{d}", _raw(f'{{"model": "tiny", "prompt": {_nested(d)}}}')) for d in DEPTHS]
    out += [(f"chat-depth{d}", _raw(f'{{"model": "tiny", "messages": {_nested(d)}}}', "/v1/chat/completions"))
            for d in DEPTHS]
    out += [(f"prompt{i}", _completion(prompt=p)) for i, p in enumerate(PROMPTS)]
    out += [(f"{k}={v!r:.20}", _completion(**{k: v})) for k, vs in {**INTS, **FLOATS}.items() for v in vs]
    out += [(f"stop{i}", _completion(stop=s)) for i, s in enumerate(STOPS)]
    out += [(f"stop_ids{i}", _completion(stop_token_ids=s)) for i, s in enumerate(STOP_IDS)]
    out += [(f"completion-other{i}", _completion(**c)) for i, c in enumerate(OTHER_COMPLETION)]
    out += [(f"messages{i}", _chat(messages=m)) for i, m in enumerate(MESSAGES)]
    out += [(f"chat-other{i}", _chat(**c)) for i, c in enumerate(OTHER_CHAT)]
    out += [("no-model", _without("/v1/completions", COMPLETION, "model")),
            ("no-prompt", _without("/v1/completions", COMPLETION, "prompt")),
            ("no-messages", _without("/v1/chat/completions", CHAT, "messages"))]
    out += [(f"route-{m}-{p}", (m, p, b"", AUTH)) for m, p in ROUTES]
    out += [(f"auth{i}", ("POST", "/v1/completions", json.dumps(COMPLETION).encode(), h)) for i, h in enumerate(AUTHS)]
    out += [(f"auth-models{i}", ("GET", "/v1/models", b"", h)) for i, h in enumerate(AUTHS[:3])]
    out += [("nan-literal", _raw('{"model": "tiny", "prompt": "a", "temperature": NaN}')),
            ("inf-literal", _raw('{"model": "tiny", "prompt": "a", "top_p": Infinity}')),
            ("huge-int-literal", _raw('{"model": "tiny", "prompt": "a", "seed": ' + "9" * 5000 + "}")),
            ("too-large", ("POST", "/v1/completions", b"x" * (9 * 1024 * 1024), AUTH))]
    return out


CASES = cases()


@pytest.fixture(scope="module")
def server(tiny_ckpt):
    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.runtime.llm import LLM
    from m3bench.bench.server import ServerConfig
    from m3bench.runtime.async_llm import AsyncLLM

    llm = LLM.from_config(EngineConfig(tiny_ckpt, num_kv_blocks=16, max_batch_size=8, async_scheduling=False))
    engine = AsyncLLM(llm)
    with serving(engine, ServerConfig("tiny", llm.max_model_len, KEY)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client
    engine.shutdown()


def test_at_least_100_cases():
    assert len(CASES) >= 100 and len({name for name, _ in CASES}) == len(CASES)


def assert_openai_error(resp) -> None:
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    assert body["error"]["code"] == resp.status_code and isinstance(body["error"]["message"], str)
    assert not any(leak in resp.text for leak in LEAKS), resp.text[:300]


@pytest.mark.parametrize("name, case", CASES, ids=[name for name, _ in CASES])
def test_bad_request_is_a_4xx_in_openai_shape(server, name, case):
    method, path, body, headers = case
    resp = server.request(method, path, content=body, headers=headers)
    assert_openai_error(resp)
    assert server.get("/health").status_code == 200  # still answering


def test_server_still_generates_after_the_fuzz(server):
    resp = server.post("/v1/completions", json=COMPLETION, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1


class _Exploding:
    """The real engine, but generation raises an error whose text must not reach the client."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def generate(self, *args, **kwargs):
        raise RuntimeError("secret-internal-detail")
        yield  # an async generator, as AsyncLLM.generate


def test_internal_error_is_500_without_exception_text(tiny_ckpt, caplog):
    from fastapi.testclient import TestClient

    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.runtime.llm import LLM
    from m3bench.bench.server import ServerConfig, create_app
    from m3bench.runtime.async_llm import AsyncLLM

    llm = LLM.from_config(EngineConfig(tiny_ckpt, num_kv_blocks=8, max_batch_size=2, async_scheduling=False))
    engine = AsyncLLM(llm)
    try:
        client = TestClient(create_app(_Exploding(engine), ServerConfig("tiny", llm.max_model_len)),
                            raise_server_exceptions=False)
        with caplog.at_level("ERROR", logger="m3bench.serve"):
            resp = client.post("/v1/completions", json=COMPLETION)
            streamed = client.post("/v1/completions", json={**COMPLETION, "stream": True})
    finally:
        engine.shutdown()
    assert resp.status_code == 500 and set(resp.json()["error"]) == ERROR_KEYS
    assert "secret-internal-detail" not in resp.text and "RuntimeError" not in resp.text
    assert streamed.status_code == 200 and "secret-internal-detail" not in streamed.text
    assert '"code": 500' in streamed.text and streamed.text.rstrip().endswith("data: [DONE]")
    assert "secret-internal-detail" in caplog.text  # the traceback goes to the log


def test_api_key_compared_in_constant_time(monkeypatch):
    import hmac
    from types import SimpleNamespace

    from m3bench.bench import server

    calls, real = [], hmac.compare_digest
    monkeypatch.setattr(server.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    request = lambda value: SimpleNamespace(headers={"authorization": value})  # noqa: E731
    assert server._authorized(request(f"Bearer {KEY}"), KEY) and not server._authorized(request("Bearer x"), KEY)
    assert not server._authorized(request("Bearer \udcff"), KEY)  # undecodable header bytes: refused, no crash
    assert calls == [(f"Bearer {KEY}".encode(), f"Bearer {KEY}".encode()), (b"Bearer x", f"Bearer {KEY}".encode()),
                     ("Bearer \udcff".encode("utf-8", "surrogateescape"), f"Bearer {KEY}".encode())]
