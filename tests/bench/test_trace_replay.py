"""Scaled replays of 16 requests of each shared trace on the tiny checkpoint: with a KV pool large enough
and one request at a time, the prefix-cache hit rate the engine reaches is the one the trace makes possible."""

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app
from shared_data import SHARED_DATA

TRACES = SHARED_DATA / "traces"
SYNTHETIC, CONVERSATION = TRACES / "synthetic_trace.jsonl", TRACES / "conversation_trace.jsonl"


def _need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=1)


def test_synthetic_trace_replay_reaches_possible_hit_rate(tiny_ckpt, tmp_path):
    """Requests 3975.. of the multi-turn trace (55% of blocks reused in the window), blocks of 16 tokens,
    the engine's 128-token pages, a context of 1500 tokens (4 of the 16 are longer: skipped, counted):
    the sweep reads the engine's counters and the possible rate."""
    out = tmp_path / "syn"
    res = CliRunner().invoke(app, [
        "sweep", "--model", str(tiny_ckpt), "--load-format", "dummy", "--dataset", f"trace:{_need(SYNTHETIC)}",
        "--trace-offset", "3975", "--max-requests", "16", "--trace-scale", "0.03125", "--concurrency", "1",
        "--warmup", "1", "--num-kv-blocks", "256", "--max-model-len", "1500", "--pareto-x", "e2e-p90",
        "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "results.json").read_text())
    (p,) = doc["points"]
    assert p["num_completed"] == 12 and p["num_skipped_too_long"] == 4 and p["max_model_len"] == 1500
    assert p["num_wrong_prompt_len"] == 0 and p["total_prompt_tokens"] == 5943  # never truncated
    assert p["num_text_len_mismatch"] is None  # token ids went
    assert p["prefix_page_tokens"] == 128 and p["trace_block_tokens"] == 16 and p["prompt_as"] == "token_ids"
    assert p["trace_block_reuse"] > 0.45 and p["prefix_hit_rate_possible"] == pytest.approx(0.56, abs=0.005)
    assert p["prefix_cache_hit_rate"] == pytest.approx(p["prefix_hit_rate_possible"], abs=1e-12)
    assert p["interactivity_e2e_p90"] > 0 and doc["config"]["pareto_x"] == "e2e-p90"
    assert "interactivity_e2e_p90" in (out / "results.csv").read_text().splitlines()[0]
    assert "E2E-int P90" in res.output and "prefix hit" in res.output


def test_conversation_trace_replay_reaches_possible_hit_rate(tiny_ckpt, tmp_path):
    """Requests 11111.. of the conversation trace at 16-token blocks on an engine of 16-token pages
    (run_point itself, the bundled engine in-process; chunked prefill)."""
    from m3bench.bench.client import EngineTarget
    from m3bench.bench.sweep import PointKey, SweepConfig, engine_scraper, run_point
    from m3bench.bench.trace import TraceSpec
    from m3bench.runtime import LLM
    from m3bench.runtime.async_llm import AsyncLLM

    spec = TraceSpec(_need(CONVERSATION), offset=11111, max_requests=16, scale=1 / 32)
    cfg = SweepConfig(out_dir=tmp_path, engine=None, warmup=0, trace=spec)
    llm = LLM(str(tiny_ckpt), load_format="dummy", tokens_per_block=16, num_kv_blocks=512, attention_backend="torch",
              max_num_tokens=200)  # prompts over 200 tokens prefill in chunks, committing pages as they fill
    engine = AsyncLLM(llm)
    try:
        row = asyncio.run(run_point(cfg, PointKey(1, 1, 96, 8), EngineTarget(engine), llm.tokenizer,
                                    engine_scraper(engine)))
    finally:
        engine.shutdown()
    assert row["num_completed"] == 16 and row["prefix_page_tokens"] == 16
    assert row["prefix_hit_rate_possible"] == pytest.approx(0.157, abs=0.005)
    assert row["prefix_cache_hit_rate"] == pytest.approx(row["prefix_hit_rate_possible"], abs=1e-12)
    assert row["num_wrong_output_len"] == 0


class _TextOnlyServer:
    """An OpenAI-style /v1/completions that refuses token-id prompts (400) and counts text prompts' tokens
    with the tokenizer, like a server without the token-ids form; /v1/models says max_model_len 200."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    async def models(self, request):
        from aiohttp import web

        return web.json_response({"data": [{"id": "m", "max_model_len": 200}]})

    async def completions(self, request):
        from aiohttp import web

        body = await request.json()
        if not isinstance(body["prompt"], str):
            return web.json_response({"error": {"message": "prompt must be a string"}}, status=400)
        self.prompts.append(body["prompt"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n_in = len(self.tokenizer.encode(body["prompt"], add_special_tokens=False))
        for i in range(body["max_tokens"]):
            await resp.write(f'data: {json.dumps({"choices": [{"index": 0, "text": "a"}]})}\n\n'.encode())
            await asyncio.sleep(0.001)
        usage = {"prompt_tokens": n_in, "completion_tokens": body["max_tokens"]}
        await resp.write(f'data: {json.dumps({"choices": [], "usage": usage})}\n\ndata: [DONE]\n\n'.encode())
        return resp


def _serve_in_thread(handler):
    """Start an aiohttp app on a free port in a thread; returns (base_url, stop())."""
    import threading

    from aiohttp import web

    ready, box = threading.Event(), {}

    def run():
        loop = asyncio.new_event_loop()
        app_ = web.Application()
        app_.router.add_get("/v1/models", handler.models)
        app_.router.add_post("/v1/completions", handler.completions)
        runner = web.AppRunner(app_)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["port"], box["loop"] = site._server.sockets[0].getsockname()[1], loop
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)

    def stop():
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(10)

    return f"http://127.0.0.1:{box['port']}", stop


def test_external_server_without_token_ids_gets_text_and_the_mismatch_reported(tiny_ckpt, tmp_path):
    from transformers import AutoTokenizer

    handler = _TextOnlyServer(AutoTokenizer.from_pretrained(str(tiny_ckpt)))
    url, stop = _serve_in_thread(handler)
    try:
        res = CliRunner().invoke(app, [
            "sweep", "--base-url", url, "--tokenizer", str(tiny_ckpt), "--dataset", f"trace:{_need(CONVERSATION)}",
            "--max-requests", "6", "--trace-scale", "0.0625", "--concurrency", "2", "--warmup", "0",
            "--out", str(tmp_path / "ext")])
    finally:
        stop()
    assert res.exit_code == 0, res.output
    (p,) = json.loads((tmp_path / "ext" / "results.json").read_text())["points"]
    assert p["prompt_as"] == "text" and handler.prompts and p["max_model_len"] == 200
    assert p["num_skipped_too_long"] == 6 - p["num_completed"] > 0  # 32-token blocks: some exceed 200 tokens
    assert p["num_wrong_prompt_len"] > 0 and "arrived at another token count" in res.output
    assert p["num_text_len_mismatch"] > 0  # the client's own re-encoding check, usage counts or not
    assert p["prefix_cache_hit_rate"] is None and p["prefix_page_tokens"] == 32  # no /metrics: trace blocks


def test_served_trace_replay_reads_prefix_counters_from_metrics(tiny_ckpt, tmp_path):
    """--serve: token ids over HTTP, the hit rate from `m3bench serve`'s /metrics, sent at the trace's times."""
    out = tmp_path / "http"
    res = CliRunner().invoke(app, [
        "sweep", "--model", str(tiny_ckpt), "--load-format", "dummy", "--dataset", f"trace:{_need(SYNTHETIC)}",
        "--trace-offset", "3987", "--max-requests", "6", "--trace-scale", "0.0625", "--concurrency", "1",
        "--warmup", "0", "--num-kv-blocks", "256", "--schedule", "timestamps", "--time-scale", "0.01",
        "--serve", "--out", str(out)])
    assert res.exit_code == 0, res.output
    (p,) = json.loads((out / "results.json").read_text())["points"]
    assert p["prompt_as"] == "token_ids" and p["num_wrong_prompt_len"] == 0 and p["prefix_page_tokens"] == 128
    assert (p["trace_requests"], p["num_skipped_too_long"]) == (6, 1)  # the last 6 of the trace, one over 4096
    assert p["prefix_hit_rate_possible"] == pytest.approx(0.561, abs=0.001)
    assert p["prefix_cache_hit_rate"] == pytest.approx(p["prefix_hit_rate_possible"], abs=1e-12)


def test_trace_flags_refused_where_they_do_not_apply(tiny_ckpt, tmp_path):
    runner = CliRunner()
    base = ["sweep", "--model", str(tiny_ckpt), "--out", str(tmp_path / "o")]
    trace = ["--dataset", f"trace:{_need(SYNTHETIC)}"]
    for extra, what in ((["--max-requests", "4"], "need --dataset trace"),
                        ([*trace, "--num-prompts", "4"], "--max-requests"),
                        ([*trace, "--schedule", "timestamps", "--request-rate", "2"], "--request-rate"),
                        ([*trace, "--schedule", "poisson"], "--schedule"),
                        ([*trace, "--trace-scale", "0.3"], "whole number"),
                        ([*trace, "--trace-offset", "99999"], "no request at offset"),
                        ([*trace, "--pareto-x", "x50"], "--pareto-x"),
                        (["--dataset", "trace:/nonexistent.jsonl"], "no such file")):
        res = runner.invoke(app, [*base, *extra])
        assert res.exit_code == 2 and what in res.output, (extra, res.output)
