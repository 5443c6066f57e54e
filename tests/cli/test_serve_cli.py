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
