"""`m3bench serve` on a tiny random checkpoint: the official openai client, errors, disconnects, KV pool."""

import asyncio
import json
import random
import time

import pytest
from server_thread import serving

openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")

KEY = "test-key"


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "overlap"])
def served(tmp_path_factory, request):
    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.runtime.llm import LLM
    from m3bench.bench.server import ServerConfig
    from m3bench.runtime.async_llm import AsyncLLM
    from m3bench.runtime.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0)
    llm = LLM.from_config(EngineConfig(str(ckpt), num_kv_blocks=24, max_batch_size=32, async_scheduling=request.param))
    assert llm.async_scheduling is request.param
    engine = AsyncLLM(llm)
    cfg = ServerConfig("tiny", llm.max_model_len, KEY)
    with serving(engine, cfg) as url:
        yield {"url": url, "engine": engine, "cfg": cfg, "tok": llm.tokenizer}
    engine.shutdown()


def _client(served, key=KEY):
    return openai.OpenAI(base_url=served["url"] + "/v1", api_key=key, max_retries=0)


def test_models_and_health(served):
    import httpx

    assert [m.id for m in _client(served).models.list().data] == ["tiny"]
    assert httpx.get(served["url"] + "/health").status_code == 200  # no key needed
    with pytest.raises(openai.AuthenticationError):
        _client(served, key="wrong").models.list()


def test_completion_greedy_matches_engine_and_logprobs(served):
    import math

    c = _client(served)
    r = c.completions.create(model="tiny", prompt="Step 3: 3 * 6 =", max_tokens=6, temperature=0, logprobs=2,
                             extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens == len(served["tok"].encode("Step 3: 3 * 6 ="))
    assert choice.finish_reason == "length" and len(choice.logprobs.tokens) == 6
    assert "".join(choice.logprobs.tokens) == choice.text
    for lp, top in zip(choice.logprobs.token_logprobs, choice.logprobs.top_logprobs):
        assert lp <= 0 and len(top) == 2 and math.isclose(max(top.values()), lp, rel_tol=1e-5)  # greedy = top-1
    again = c.completions.create(model="tiny", prompt="Step 3: 3 * 6 =", max_tokens=6, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert again.choices[0].text == choice.text  # greedy is deterministic


def test_streaming_completion_equals_non_streaming(served):
    c = _client(served)
    ids = served["tok"].encode("Step 7: 7 * 10 = 70", add_special_tokens=False)
    full = c.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    chunks = list(c.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True, "return_token_ids": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.choices[0].text
    assert sum(len(ch.choices[0].token_ids) for ch in chunks if ch.choices) == 8
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].usage.prompt_tokens == len(ids)


def test_echo_and_stop(served):
    c = _client(served)
    r = c.completions.create(model="tiny", prompt="Step 2:", max_tokens=3, temperature=0, echo=True)
    assert r.choices[0].text.startswith("Step 2:")
    streamed = c.completions.create(model="tiny", prompt="Step 2:", max_tokens=3, temperature=0, echo=True, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == r.choices[0].text
    base = c.completions.create(model="tiny", prompt="Step 2:", max_tokens=12, temperature=0,
                                extra_body={"ignore_eos": True}).choices[0].text
    stop = base[4:6]
    cut = c.completions.create(model="tiny", prompt="Step 2:", max_tokens=12, temperature=0, stop=[stop],
                               extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and stop not in cut.text and base.startswith(cut.text)


def test_chat_template_and_streaming(served):
    c = _client(served)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                  top_logprobs=1, extra_body={"ignore_eos": True})
    text = served["tok"].apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(served["tok"].encode(text, add_special_tokens=False))
    assert r.choices[0].message.role == "assistant" and len(r.choices[0].logprobs.content) == 5
    stream = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == r.choices[0].message.content
    kw = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, temperature=0,
                                   extra_body={"chat_template_kwargs": {"thinking_mode": "disabled"}})
    assert kw.usage.prompt_tokens > r.usage.prompt_tokens  # the template added the empty think block
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                  extra_body={"chat_template_kwargs": {"thinking_mode": "bogus"}})


def _post(served, body: bytes, path="/v1/completions"):
    import httpx

    return httpx.post(served["url"] + path, content=body, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})


def test_malformed_requests_get_4xx_json(served):
    limit = served["cfg"].max_model_len
    cases = [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"model": "nope", "prompt": "hi"}).encode(), 404),
        (json.dumps({"model": "tiny"}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": -1}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "hi", "bogus_field": 1}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": [1] * (limit + 1)}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": [1, 2], "max_tokens": limit}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": [10 ** 9]}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "x" * (9 * 1024 * 1024)}).encode(), 413),
    ]
    for body, status in cases:
        r = _post(served, body)
        assert r.status_code == status, (body[:60], r.text)
        assert "message" in r.json()["error"]
    r = _post(served, json.dumps({"model": "tiny", "messages": []}).encode(), "/v1/chat/completions")
    assert r.status_code == 400
    hi = [{"role": "user", "content": "hi"}]
    r = _post(served, json.dumps({"model": "tiny", "messages": hi, "top_logprobs": 2}).encode(), "/v1/chat/completions")
    assert r.status_code == 400 and "top_logprobs needs logprobs" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        _client(served).completions.create(model="tiny", prompt=[5] * (limit + 10), max_tokens=1)
    assert _client(served).models.list().data  # still serving


def test_metrics_prometheus_text(served):
    import httpx

    _client(served).completions.create(model="tiny", prompt=[3, 4, 5], max_tokens=2)
    text = httpx.get(served["url"] + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")}
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_pages_in_use", "prompt_tokens_total",
                 "generation_tokens_total", "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "request_success_total"):
        assert f"m3bench:{name}" in values
    assert values["m3bench:generation_tokens_total"] >= 2 and values["m3bench:prompt_tokens_total"] >= 3
    assert "m3bench:spec_decode_num_accepted_tokens_per_pos_total" in text
    assert httpx.get(served["url"] + "/metrics").status_code == 401


def test_metrics_export_prefix_cache_counters(served):
    """prefix_cache_{queries,hits}_total (tokens) and cache_config_info's block_size, read back by the sweep."""
    from m3bench.bench.sweep import scrape_metrics

    before = asyncio.run(scrape_metrics(served["url"], KEY))
    prompt = [7 + i % 300 for i in range(260)]
    for _ in range(2):
        _client(served).completions.create(model="tiny", prompt=prompt, max_tokens=1)
    after = asyncio.run(scrape_metrics(served["url"], KEY))
    assert after.page_tokens == 128
    win = after.prefix.minus(before.prefix)
    assert (win.queried_tokens, win.hit_tokens) == (520, 256)  # the second request reuses 2 whole pages


async def _stream_and_maybe_drop(session, url, rng, i):
    body = {"model": "tiny", "prompt": [1 + i % 50, 2, 3, 4], "max_tokens": 24 if i % 2 else 6, "stream": True,
            "ignore_eos": True, "temperature": 0}
    drop = i % 2 == 1 and rng.random() < 0.8
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if drop and line.startswith(b"data: {"):
                resp.close()  # the client goes away mid-stream
                return "dropped"
        return "done"


def test_200_streams_with_random_disconnects_free_the_kv_pool(served):
    engine = served["engine"]
    before = engine.stats_sync()

    async def main():
        rng = random.Random(0)
        url = served["url"] + "/v1/completions"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return await asyncio.gather(*(_stream_and_maybe_drop(session, url, rng, i) for i in range(200)))

    outcomes = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert outcomes.count("dropped") > 40 and outcomes.count("done") > 90
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        s = engine.stats_sync()
        if s.num_running == 0 and s.num_waiting == 0 and s.kv_pages_free == before.kv_pages_free:
            break
        time.sleep(0.1)
    assert (s.num_running, s.num_waiting) == (0, 0)
    assert s.kv_pages_free == before.kv_pages_free == s.kv_pages_total
    assert s.requests_aborted_total - before.requests_aborted_total > 20  # disconnects reached the engine
    assert s.generation_tokens_total - before.generation_tokens_total < 100 * 6 + 100 * 24  # the dropped stopped early


def test_non_streaming_client_disconnect_aborts(served):
    engine = served["engine"]
    before = engine.stats_sync()
    host, port = served["url"].removeprefix("http://").split(":")
    body = json.dumps({"model": "tiny", "prompt": [7, 8, 9], "max_tokens": 1500, "ignore_eos": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()

    async def main():
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + body)
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.close()  # gone before the answer
        await writer.wait_closed()

    asyncio.run(main())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        s = engine.stats_sync()
        if s.requests_aborted_total > before.requests_aborted_total and s.kv_pages_free == s.kv_pages_total:
            break
        time.sleep(0.05)
    assert s.requests_aborted_total == before.requests_aborted_total + 1
    assert s.kv_pages_free == s.kv_pages_total and s.num_running == 0
    assert s.generation_tokens_total - before.generation_tokens_total < 1500


def test_batch_prompts_and_content_parts(served):
    c = _client(served)
    r = c.completions.create(model="tiny", prompt=["Step 1:", "Step 2:"], max_tokens=3, temperature=0,
                             extra_body={"ignore_eos": True})
    assert [ch.index for ch in r.choices] == [0, 1] and r.usage.completion_tokens == 6
    one = c.completions.create(model="tiny", prompt="Step 2:", max_tokens=3, temperature=0,
                               extra_body={"ignore_eos": True})
    assert r.choices[1].text == one.choices[0].text
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 3?"}]}]
    plain = [{"role": "user", "content": "What is 2 + 3?"}]
    a = c.chat.completions.create(model="tiny", messages=parts, max_tokens=3, temperature=0)
    b = c.chat.completions.create(model="tiny", messages=plain, max_tokens=3, temperature=0)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens and a.choices[0].message.content == b.choices[0].message.content
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny", prompt="x", n=2)


def test_m3bench_serve_process_with_openai_client(tmp_path):
    """The real command: `python -m m3bench serve` on loopback with an API key, driven by the openai client."""
    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.bench.sweep import free_port, start_server, stop_server, wait_healthy
    from m3bench.runtime.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path / "tiny", seed=3)
    port = free_port()
    proc = start_server(EngineConfig(str(ckpt), load_format="dummy", num_kv_blocks=8), port, "s3cret")
    try:
        asyncio.run(wait_healthy(f"http://127.0.0.1:{port}", proc, timeout_s=120))
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="s3cret", max_retries=0)
        assert c.models.list().data[0].id == "m3bench-sweep"
        r = c.completions.create(model="m3bench-sweep", prompt="Step 4:", max_tokens=4, temperature=0,
                                 extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 4
        chunks = list(c.chat.completions.create(model="m3bench-sweep", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3, stream=True, extra_body={"ignore_eos": True}))
        assert chunks[-1].choices[0].finish_reason == "length"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="no", max_retries=0).models.list()
    finally:
        stop_server(proc)
    assert proc.returncode is not None
