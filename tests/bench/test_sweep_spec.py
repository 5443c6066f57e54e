"""Speculative sweeps and serving: --draft / --synthetic-acceptance end to end on the tiny pair (CPU)."""

import asyncio
import json

import pytest
from typer.testing import CliRunner

from m3bench.runtime.engine_config import EngineConfig
from m3bench.bench.sweep import free_port, parse_spec_counters, scrape_metrics, start_server, stop_server, wait_healthy
from m3bench.cli.main import app
from m3bench.runtime.errors import InputError

AL = 2.5
AL_TOL = 0.2  # forced counts are 1 or 2 (Bernoulli 0.5) per step; ~100+ steps, plus clipping at the end


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from m3bench.runtime.speculative.tiny_draft import write_tiny_draft
    from m3bench.runtime.tiny import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("pair")
    target = write_tiny_checkpoint(root / "target", seed=1)
    write_tiny_draft(root / "draft", target_dir=target, seed=2)
    return target, root / "draft"


def _args(target, draft, out, *extra):
    return ["sweep", "--model", str(target), "--draft", str(draft), "--draft-len", "3", "--synthetic-acceptance",
            str(AL), "--concurrency", "1,4", "--isl", "16", "--osl", "24", "--num-prompts", "4", "--warmup", "2",
            "--num-kv-blocks", "32", "--out", str(out), *extra]


def test_inprocess_sweep_reports_synthetic_acceptance(tiny_pair, tmp_path):
    target, draft = tiny_pair
    res = CliRunner().invoke(app, _args(target, draft, tmp_path / "run"))
    assert res.exit_code == 0, res.output
    assert " syn" in res.output  # the table's AL column says the acceptance was forced
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    for p in doc["points"]:
        assert p["num_completed"] == 4 and p["num_wrong_output_len"] == 0 and p["synthetic"] is True
        assert abs(p["spec_acceptance_length"] - AL) < AL_TOL, p["spec_acceptance_length"]
        # window counters only: the measured run's output tokens bound its verify steps (warm-up excluded)
        assert p["spec_num_drafts"] <= p["total_output_tokens"]
        assert p["spec_acceptance_rate"] == pytest.approx(p["spec_num_accepted_tokens"] / p["spec_num_draft_tokens"])
        assert p["spec_acceptance_length"] == pytest.approx(1 + p["spec_num_accepted_tokens"] / p["spec_num_drafts"])
    header = (tmp_path / "run" / "results.csv").read_text().splitlines()[0].split(",")
    assert {"spec_acceptance_length", "spec_acceptance_rate", "synthetic"} <= set(header)


def test_synthetic_without_draft_is_a_clear_error(tiny_pair, tmp_path):
    target, _ = tiny_pair
    res = CliRunner().invoke(app, ["sweep", "--model", str(target), "--synthetic-acceptance", "2", "--out",
                                   str(tmp_path / "x")])
    assert res.exit_code == 2 and "needs --draft" in res.output
    with pytest.raises(InputError, match="needs --draft"):
        EngineConfig(str(target), synthetic_acceptance=2.0)
    with pytest.raises(InputError, match="separate, shared"):
        EngineConfig(str(target), draft=str(target), draft_kv="both")


def test_serve_metrics_count_speculation(tiny_pair):
    """`m3bench serve --draft ... --synthetic-acceptance`: /metrics counters grow and give the forced AL."""
    target, draft = tiny_pair
    opts = EngineConfig(str(target), num_kv_blocks=32, draft=str(draft), draft_len=3, synthetic_acceptance=AL)
    port = free_port()
    proc = start_server(opts, port, None)
    try:
        asyncio.run(_exercise(f"http://127.0.0.1:{port}", proc))
    finally:
        stop_server(proc)


async def _exercise(base: str, proc) -> None:
    import aiohttp

    await wait_healthy(base, proc, timeout_s=120)
    before = (await scrape_metrics(base, None)).spec
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/metrics") as r:
            text = await r.text()
        assert "m3bench:spec_decode_num_drafts_total 0" in text
        body = {"model": "m3bench-sweep", "prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 40, "ignore_eos": True}
        for _ in range(3):
            async with s.post(f"{base}/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["usage"]["completion_tokens"] == 40
        async with s.get(f"{base}/metrics") as r:
            after = parse_spec_counters(await r.text())
    assert before is not None and before.drafts == 0
    win = after.minus(before)
    assert win.drafts > 0 and win.draft_tokens <= 3 * win.drafts
    assert sum(win.accepted_per_pos) == win.accepted_tokens and len(win.accepted_per_pos) == 3
    assert list(win.accepted_per_pos) == sorted(win.accepted_per_pos, reverse=True)  # prefix acceptance
    assert abs(1 + win.accepted_tokens / win.drafts - AL) < AL_TOL
    # each drafted step emits at most its accepted tokens plus one (a last step's excess past max_tokens is cut)
    assert 3 * 40 - 3 - win.drafts <= win.accepted_tokens + win.drafts <= 3 * 40


def test_inprocess_window_excludes_warmup(tiny_pair, tmp_path):
    """The point's counters are the measured window's: the engine's totals also hold the warm-up's steps."""
    from m3bench.bench.sweep import PointKey, SweepConfig, open_target, run_point

    target, draft = tiny_pair
    opts = EngineConfig(str(target), num_kv_blocks=32, draft=str(draft), draft_len=3, synthetic_acceptance=AL)
    cfg = SweepConfig(out_dir=tmp_path, engine=opts, concurrencies=(2,), lengths=((16, 24),), num_prompts=2, warmup=2)

    async def go():
        async with open_target(cfg, 1) as (tgt, tok, scrape):
            row = await run_point(cfg, PointKey(1, 2, 16, 24), tgt, tok, scrape)
            return row, (await scrape()).spec, tgt.engine.llm.spec_stats()

    row, totals, stats = asyncio.run(go())
    assert (totals.drafts, totals.accepted_tokens) == (stats.drafts, stats.accepted)  # /metrics = llm.spec_stats()
    assert 0 < row["spec_num_drafts"] < stats.drafts  # warm-up (2 requests like the measured 2) left out
    assert abs(row["spec_num_drafts"] - stats.drafts / 2) <= stats.drafts / 4


def test_served_sweep_reads_acceptance_from_metrics(tiny_pair, tmp_path):
    """--serve passes --draft / --synthetic-acceptance to `m3bench serve`; AL comes from /metrics deltas."""
    target, draft = tiny_pair
    res = CliRunner().invoke(app, [*_args(target, draft, tmp_path / "http"), "--serve", "--concurrency", "2"])
    assert res.exit_code == 0, res.output
    (p,) = json.loads((tmp_path / "http" / "results.json").read_text())["points"]
    assert p["num_completed"] == 4 and p["synthetic"] is True
    assert abs(p["spec_acceptance_length"] - AL) < AL_TOL
    assert p["spec_num_drafts"] <= p["total_output_tokens"]
