"""`m3bench serve` turns bad input into one line and exit code 2 (the running server is tested in tests/bench)."""

from typer.testing import CliRunner

from m3bench.cli.main import app


def test_serve_bad_inputs_exit_2(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["serve", "--model", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "m3bench: error:" in res.output
    res = runner.invoke(app, ["serve", "--model", str(tmp_path), "--load-format", "bogus"])
    assert res.exit_code == 2 and "--load-format" in res.output


def test_serve_help_lists_the_options():
    res = CliRunner().invoke(app, ["serve", "--help"])
    assert res.exit_code == 0
    for opt in ("--model", "--load-format", "--host", "--port", "--api-key"):
        assert opt in res.output


def test_async_scheduling_flags_round_trip(tmp_path):
    """serve_args writes the flag `m3bench serve` reads (the sweep's --serve mode relies on it); with a draft
    it is accepted now (overlap with speculation: tests/runtime/speculative/test_spec_overlap.py)."""
    from pathlib import Path

    from m3bench.bench.engine_options import serve_args
    from m3bench.runtime.engine_config import EngineConfig

    assert "async-scheduling" not in " ".join(serve_args(EngineConfig(Path("m"))))
    assert "--async-scheduling" in serve_args(EngineConfig(Path("m"), async_scheduling=True))
    assert "--no-async-scheduling" in serve_args(EngineConfig(Path("m"), async_scheduling=False))
    from m3bench.runtime.speculative.tiny_draft import write_tiny_draft
    from m3bench.runtime.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path / "tiny", seed=0)
    draft = tmp_path / "draft"
    write_tiny_draft(draft, ckpt)
    from m3bench.runtime.engine_config import resolve

    cfg = resolve(EngineConfig(ckpt, draft=draft, async_scheduling=True, device="cpu"))
    assert cfg.async_scheduling and "--async-scheduling" in serve_args(cfg) and str(draft) in serve_args(cfg)
