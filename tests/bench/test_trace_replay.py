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
    the engine's 128-token pages: the sweep reads the engine's counters and the possible rate."""
    out = tmp_path / "syn"
    res = CliRunner().invoke(app, [
        "sweep", "--model", str(tiny_ckpt), "--load-format", "dummy", "--dataset", f"trace:{_need(SYNTHETIC)}",
        "--trace-offset", "3975", "--max-requests", "16", "--trace-scale", "0.03125", "--concurrency", "1",
        "--warmup", "1", "--num-kv-blocks", "256", "--pareto-x", "e2e-p90", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "results.json").read_text())
    (p,) = doc["points"]
    assert p["num_completed"] == 16 and p["num_skipped_too_long"] == 0 and p["num_wrong_prompt_len"] == 0
    assert p["prefix_page_tokens"] == 128 and p["trace_block_tokens"] == 16 and p["prompt_as"] == "token_ids"
    assert p["trace_block_reuse"] == pytest.approx(0.55, abs=0.01)
    assert p["prefix_hit_rate_possible"] > 0.45
    assert p["prefix_cache_hit_rate"] == pytest.approx(p["prefix_hit_rate_possible"], abs=1e-12)
    assert p["interactivity_e2e_p90"] > 0 and doc["config"]["pareto_x"] == "e2e-p90"
    assert "interactivity_e2e_p90" in (out / "results.csv").read_text().splitlines()[0]
    assert "E2E-int P90" in res.output and "prefix hit" in res.output


def test_conversation_trace_replay_reaches_possible_hit_rate(tiny_ckpt, tmp_path):
    """Requests 11111.. of the conversation trace at 16-token blocks on an engine of 16-token pages
    (run_point itself, the bundled engine in-process)."""
    from m3bench.bench.client import EngineTarget
    from m3bench.bench.sweep import PointKey, SweepConfig, engine_scraper, run_point
    from m3bench.bench.trace import TraceSpec
    from m3bench.runtime import LLM
    from m3bench.runtime.async_llm import AsyncLLM

    spec = TraceSpec(_need(CONVERSATION), offset=11111, max_requests=16, scale=1 / 32)
    cfg = SweepConfig(out_dir=tmp_path, engine=None, warmup=0, trace=spec)
    llm = LLM(str(tiny_ckpt), load_format="dummy", tokens_per_block=16, num_kv_blocks=512, attention_backend="torch")
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
