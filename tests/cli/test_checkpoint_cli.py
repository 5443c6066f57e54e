"""`m3bench checkpoint tiny` / `inspect`: good checkpoints pass, bad ones are one line and exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from m3bench.cli.main import app

runner = CliRunner()


def _inspect(path: Path):
    return runner.invoke(app, ["checkpoint", "inspect", str(path)])


def _one_line_error(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("m3bench: error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.output


@pytest.fixture()
def broken(tiny_ckpt, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))


def _edit_tensors(path: Path, edit) -> None:
    t = load_file(str(path / "model.safetensors"))
    edit(t)
    save_file(t, str(path / "model.safetensors"))


@pytest.mark.parametrize("layout,shards", [("m3", 1), ("vl", 2), ("v5", 1), ("v5-vl", 3)])
def test_tiny_then_inspect(tmp_path, layout, shards):
    dest = tmp_path / layout
    made = runner.invoke(app, ["checkpoint", "tiny", str(dest), "--seed", "4", "--layout", layout,
                               "--shards", str(shards)])
    assert made.exit_code == 0, made.output
    assert (dest / "config.json").exists() and (dest / "tokenizer.json").exists()
    assert (dest / "model.safetensors.index.json").exists() == (shards > 1)
    result = _inspect(dest)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"ok: {dest}"
    assert "MSA layers [1, 2, 3]: block 128, top-2 blocks" in result.stderr


def test_bad_layout_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["checkpoint", "tiny", str(tmp_path / "x"), "--layout", "gguf"])
    assert result.exit_code == 2 and not (tmp_path / "x").exists()


def test_missing_tensor(broken):
    _edit_tensors(broken, lambda t: t.pop("model.layers.3.block_sparse_moe.experts.1.w2.weight"))
    _one_line_error(_inspect(broken), "1 missing: layers.3.moe.experts.1.down_proj.weight")


def test_wrong_shape(broken):
    def edit(t):
        t["model.norm.weight"] = t["model.norm.weight"][:100].clone()

    _edit_tensors(broken, edit)
    _one_line_error(_inspect(broken), "mis-shaped: norm.weight (100,) (expected (256,))")


def test_corrupt_safetensors(broken):
    f = broken / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-4096])
    _one_line_error(_inspect(broken), "cannot read")


def test_unknown_model_type(broken):
    raw = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**raw, "model_type": "gpt_bigcode"}))
    _one_line_error(_inspect(broken), "unsupported model_type 'gpt_bigcode'")


def test_not_a_directory(tmp_path):
    _one_line_error(_inspect(tmp_path / "nowhere"), "is not a directory")


def test_real_process_prints_no_traceback(broken):
    _edit_tensors(broken, lambda t: t.pop("lm_head.weight"))
    out = subprocess.run([sys.executable, "-m", "m3bench", "checkpoint", "inspect", str(broken)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"m3bench: error: checkpoint {broken} does not match its config: 1 missing: lm_head.weight"]


@pytest.mark.parametrize("key, value", [("eos_token_id", "x"), ("hidden_size", "big"), ("hidden_size", "256"),
                                        ("num_hidden_layers", 4.5), ("vocab_size", 1e12)])
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_bad_config_values_are_one_line_exit_2(broken, key, value, command):
    cfg = json.loads((broken / "config.json").read_text())
    cfg[key] = value
    (broken / "config.json").write_text(json.dumps(cfg))
    args = (["checkpoint", "inspect", str(broken)] if command == "inspect" else
            ["generate", "--model", str(broken), "--prompt-ids", "1,2", "--load-format", "dummy"])
    _one_line_error(runner.invoke(app, args), key)


@pytest.mark.parametrize("quant", ["mxfp8", "nvfp4"])
def test_tiny_quantized_then_inspect_generate_and_plan(tmp_path, quant):
    dest = tmp_path / quant
    made = runner.invoke(app, ["checkpoint", "tiny", str(dest), "--layout", "vl", "--shards", "2", "--quant", quant])
    assert made.exit_code == 0, made.output
    result = _inspect(dest)
    assert result.exit_code == 0 and f"quant {quant}" in result.stderr, result.output
    outs = []
    for weights in ("auto", "bfloat16"):
        gen = runner.invoke(app, ["generate", "--model", str(dest), "--prompt-ids", "5,6,7", "--max-tokens", "4",
                                  "--json", "--weights-dtype", weights])
        assert gen.exit_code == 0, gen.output
        outs.append(json.loads(gen.stdout)["token_ids"])
    assert outs[0] == outs[1]  # the same weights, native or dequantized
    plan = runner.invoke(app, ["checkpoint", "plan", str(dest), "--json", "--gpu-memory-gib", "80"])
    assert plan.exit_code == 0 and json.loads(plan.stdout)["weights"] == {"mxfp8": "mxfp8",  # as the runtime
                                                                          "nvfp4": "nvfp4-experts"}[quant]  # holds them


def test_quant_needs_m3_names(tmp_path):
    r = runner.invoke(app, ["checkpoint", "tiny", str(tmp_path / "x"), "--layout", "v5", "--quant", "mxfp8"])
    assert r.exit_code == 2 and "--layout m3 or vl" in r.stderr
