"""An uncaught exception in any command: one line naming it and a log file with the traceback, exit 3."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app


def _log_path(line: str) -> Path:
    return Path(line.rsplit("(traceback in ", 1)[1].rstrip(")"))


@pytest.mark.parametrize("command, target", [
    (["generate", "--model", "m", "--prompt", "x"], "m3bench.cli.generate.run_generate"),
    (["accuracy", "--model", "m", "--out", "OUT"], "m3bench.cli.accuracy.check_options"),
    (["checkpoint", "inspect", "m"], "m3bench.runtime.config.ModelConfig.from_pretrained"),
])
def test_forced_exception_is_one_line_exit_3_and_a_log(command, target, tmp_path, monkeypatch):
    import importlib

    def boom(*args, **kwargs):
        raise RuntimeError("forced failure\nsecond line")

    module, _, name = target.rpartition(".")
    try:
        owner = importlib.import_module(module)
    except ModuleNotFoundError:  # a class attribute: module.Class.method
        module, _, cls = module.rpartition(".")
        owner = getattr(importlib.import_module(module), cls)
    monkeypatch.setattr(owner, name, boom)
    (tmp_path / "m").mkdir()
    argv = [a.replace("OUT", str(tmp_path / "out")).replace("m", str(tmp_path / "m")) if a in ("m", "OUT") else a
            for a in command]
    res = CliRunner().invoke(app, argv, env={"M3BENCH_LOG_DIR": str(tmp_path / "logs")})
    assert res.exit_code == 3, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("m3bench: internal error: RuntimeError: forced failure second line")
    log = _log_path(lines[0])
    assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text() and "forced failure" in log.read_text()
    assert "Traceback" not in res.output


def test_real_process_exits_3_never_1(tmp_path):
    code = ("import sys, m3bench.cli.generate as g; g.run_generate = lambda **k: 1 / 0; "
            "from m3bench.cli.main import run; sys.argv = ['m3bench', 'generate', '--model', 'm', '--prompt', 'x']; run()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "M3BENCH_LOG_DIR": str(tmp_path)})
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "internal error: ZeroDivisionError" in done.stderr
    assert "ZeroDivisionError" in _log_path(done.stderr.strip()).read_text()


def test_input_error_outside_user_errors_is_exit_2(tmp_path, monkeypatch):
    from m3bench.runtime.errors import ConfigError

    def bad(*args, **kwargs):
        raise ConfigError("config.json: hidden_size must be an integer")

    monkeypatch.setattr("m3bench.cli.generate.run_generate", bad)
    res = CliRunner().invoke(app, ["generate", "--model", "m", "--prompt", "x"], env={"M3BENCH_LOG_DIR": str(tmp_path)})
    assert res.exit_code == 2 and res.output.strip() == "m3bench: error: config.json: hidden_size must be an integer"


def test_ctrl_c_is_exit_130_without_traceback(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("m3bench.cli.generate.run_generate", interrupted)
    res = CliRunner().invoke(app, ["generate", "--model", "m", "--prompt", "x"], env={"M3BENCH_LOG_DIR": str(tmp_path)})
    assert res.exit_code == 130 and res.output.strip() == "m3bench: interrupted"
