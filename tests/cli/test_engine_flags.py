"""The engine option group: the same flags on every command that builds an engine, and bad engine input
reaches the user as one line and exit 2 before any work starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from m3bench.bench.engine_options import serve_args
from m3bench.cli.engine_flags import FLAG_NAMES, EngineFlags, engine_flags
from m3bench.cli.main import app
from m3bench.runtime.engine_config import EngineConfig

ENGINE_COMMANDS = ("generate", "accuracy", "accept", "serve", "sweep", "lm-eval")
HUGE_SEED = "99999999999999999999999"


def _commands() -> dict:
    return typer.main.get_command(app).commands


def _engine_params(name: str) -> dict:
    return {p.name: p for p in _commands()[name].params if p.name in FLAG_NAMES}


def _describe(p) -> tuple:
    return (tuple(p.opts), tuple(p.secondary_opts), repr(p.default), p.help, p.type_descriptor.annotation,
            p.show_default, p.is_flag, p.min, p.max, p.rich_help_panel)


def test_the_option_group_is_identical_on_every_engine_command():
    first = {k: _describe(p) for k, p in _engine_params(ENGINE_COMMANDS[0]).items()}
    assert set(first) == set(FLAG_NAMES)
    for name in ENGINE_COMMANDS[1:]:
        assert {k: _describe(p) for k, p in _engine_params(name).items()} == first, name


def test_defaults_are_auto_and_shown_in_help():
    params = _engine_params("serve")
    assert params["device"].default == "auto" and params["cuda_graphs"].default is None
    assert params["async_scheduling"].default is None
    out = CliRunner().invoke(app, ["sweep", "--help"], env={"COLUMNS": "200"}).output
    assert "[r L, L]" in out and "[L(1-r), L(1+r)]" in out  # help text as written (no markup eaten)
    for flag in ("--cuda-graphs / --no-cuda-graphs", "--tp", "--max-num-tokens", "--device"):
        assert flag in out


def test_engine_flags_defaults_are_the_options_defaults():
    from dataclasses import fields

    assert tuple(f.name for f in fields(EngineFlags)) == FLAG_NAMES
    params = _engine_params("generate")
    for f in fields(EngineFlags):
        assert getattr(params[f.name].default, "value", params[f.name].default) == f.default, f.name


def test_a_command_declaring_an_engine_flag_itself_is_refused():
    def cmd(device: str = "cpu", engine: EngineFlags = EngineFlags()) -> None: ...

    with pytest.raises(TypeError, match="device"):
        engine_flags(cmd)


def _argv(command: str, tmp_path: Path) -> list[str]:
    """The command with what it requires, pointed at an empty directory (nothing loads before the check)."""
    base = {"generate": ["--model", str(tmp_path), "--prompt-ids", "1,2"], "serve": ["--model", str(tmp_path)],
            "sweep": ["--model", str(tmp_path), "--out", str(tmp_path / "out")],
            "lm-eval": ["--model", str(tmp_path), "--tasks", "mmlu"],
            "accuracy": ["--model", str(tmp_path), "--no-reference"], "accept": ["--model", str(tmp_path)]}
    return [command, *base[command]]


BAD = [(["--device", "tpu"], "unknown device 'tpu'"), (["--tokens-per-block", "7"], "not a supported page size"),
       (["--device", "cuda:99"], "cuda:99"), (["--dtype", "auto", "--max-batch-size", "0"], "max_batch_size"),
       (["--attention-dp"], "attention_dp needs tensor_parallel_size > 1")]


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
@pytest.mark.parametrize("extra, needle", BAD, ids=["tpu", "page7", "cuda99", "batch0", "adp-tp1"])
def test_bad_engine_flags_are_one_line_exit_2(command, extra, needle, tmp_path):
    res = CliRunner().invoke(app, [*_argv(command, tmp_path), *extra])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("m3bench: error: "), res.output
    assert needle in lines[0] and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()  # validated before any work


@pytest.mark.parametrize("command", ("generate", "serve", "sweep", "lm-eval"))  # their --seed seeds the engine
def test_a_seed_past_64_bits_is_one_line_exit_2(command, tmp_path):
    res = CliRunner().invoke(app, [*_argv(command, tmp_path), "--seed", HUGE_SEED])
    assert res.exit_code == 2 and res.stderr.strip().splitlines() == [
        f"m3bench: error: seed must be in [0, 2**63 - 1], got {HUGE_SEED}"], res.output


def test_cuda_without_cuda_is_one_line_exit_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = CliRunner().invoke(app, [*_argv("generate", tmp_path), "--device", "cuda"])
    assert res.exit_code == 2 and "CUDA is not available" in res.stderr and len(res.stderr.splitlines()) == 1


def test_serve_args_parse_back_to_the_same_config(tmp_path):
    """What the sweep's --serve mode passes to `m3bench serve` is read back as the same EngineConfig."""
    draft = tmp_path / "draft"
    draft.mkdir()
    cfg = EngineConfig(tmp_path, load_format="dummy", device="cpu", dtype="float32", kv_cache_dtype="fp8",
                       tokens_per_block=32, max_batch_size=7, max_num_tokens=96, num_kv_blocks=12,
                       gpu_memory_utilization=0.5, enable_prefix_caching=False, cuda_graphs=False,
                       async_scheduling=False, attention_backend="torch", tensor_parallel_size=2, attention_dp=True,
                       seed=5, draft=draft,
                       draft_len=2, draft_kv="shared", synthetic_acceptance=2.5)
    ctx = _commands()["serve"].make_context("serve", serve_args(cfg))
    flags = EngineFlags(**{k: getattr(ctx.params[k], "value", ctx.params[k]) for k in FLAG_NAMES})
    assert flags.unresolved(Path(ctx.params["model"]), seed=ctx.params["seed"]) == cfg
