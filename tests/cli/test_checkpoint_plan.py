"""`m3bench checkpoint plan` (exit 0 fits, 1 does not, 2 bad input) and the plan run before engines load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app

runner = CliRunner()
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "minimax-m3"


def _plan(*args: str):
    return runner.invoke(app, ["checkpoint", "plan", *args])


def test_preset_tp8_mxfp8_fits():
    r = _plan("--preset", "minimax-m3", "--tp", "8", "--weights", "mxfp8", "--gpu-memory-gib", "141")
    assert r.exit_code == 0, r.output
    assert "routed_experts" in r.stdout and "index-K" in r.stdout and r.stdout.strip().endswith("verdict: fits")


def test_tp1_does_not_fit_exit_1_and_json():
    r = _plan("--preset", "minimax-m3", "--tp", "1", "--gpu-memory-gib", "141", "--json")
    assert r.exit_code == 1, r.output
    d = json.loads(r.stdout)
    assert not d["fits"] and d["shortfall_bytes"] > 700 * 2 ** 30 and d["weights"] == "bf16"
    assert set(d["weight_bytes_by_part"]) >= {"embeddings", "attention", "index", "dense_mlp", "routed_experts",
                                              "shared_expert", "lm_head", "eagle3_draft"}


def test_attention_dp_keeps_attention_and_kv_heads_whole():
    """--tp 8 --attention-dp: the experts of TP8/EP8, the attention and KV heads of TP 1."""
    tp8, dp8, tp1 = (json.loads(_plan("--preset", "minimax-m3", "--weights", "mxfp8", "--gpu-memory-gib", "141",
                                      "--json", *extra).stdout)
                     for extra in (("--tp", "8"), ("--tp", "8", "--attention-dp"), ("--tp", "1")))
    assert dp8["attention_dp"] and not tp8["attention_dp"]
    part = lambda d, p: d["weight_bytes_by_part"][p]  # noqa: E731
    assert part(dp8, "routed_experts") == part(tp8, "routed_experts") and part(dp8, "attention") == part(tp1, "attention")
    assert dp8["kv_bytes_per_token"] == tp1["kv_bytes_per_token"] > tp8["kv_bytes_per_token"]


def test_dir_reads_the_checkpoint_format(tmp_path):
    shutil.copy(FIXTURES / "vl-mxfp8.json", tmp_path / "config.json")
    r = _plan(str(tmp_path), "--tp", "8", "--gpu-memory-gib", "141", "--json", "--eagle3", "mha")
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["weights"] == "mxfp8" and d["weight_bytes_by_part"]["eagle3_draft"] > 0


@pytest.mark.parametrize("args, needle", [
    ((), "give a checkpoint DIR or --preset"),
    (("--preset", "minimax-m3", "--tp", "3"), "split over"),
    (("/nonexistent-dir",), "is not a directory"),
    (("--preset", "minimax-m3", "--tp", "8", "--attention-dp", "--ep", "4"), "leave out --ep"),
    *[(("--preset", "minimax-m3", "--gpu-memory-gib", v), "gpu_memory_gib must be a positive finite")
      for v in ("nan", "inf", "-1", "0")],
    (("--preset", "minimax-m3", "--gpu-memory-utilization", "nan"), "gpu_memory_utilization must be in"),
])
def test_bad_input_is_exit_2(args, needle):
    r = _plan(*args)
    assert r.exit_code == 2 and needle in r.stderr and "Traceback" not in r.output


@pytest.fixture()
def too_big(tiny_ckpt, tmp_path) -> Path:
    """The tiny checkpoint's directory with a config that cannot fit in this host's memory."""
    path = Path(shutil.copytree(tiny_ckpt, tmp_path / "big"))
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(num_local_experts=65536, intermediate_size=1 << 20)  # ~10^14 parameters
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_generate_refuses_with_the_plan(too_big):
    r = runner.invoke(app, ["generate", "--model", str(too_big), "--prompt-ids", "1,2", "--load-format", "dummy"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit by" in lines[0] and "memory plan per rank" in lines[0]


def test_serve_sweep_and_accuracy_engines_refuse_with_the_plan(too_big):
    from m3bench.evals.backends.runtime import RuntimeBackend
    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.runtime.errors import InputError
    from m3bench.runtime.llm import LLM

    with pytest.raises(InputError, match="does not fit by"):  # serve and the in-process sweep build this way
        LLM.from_config(EngineConfig(too_big, load_format="dummy"))
    with pytest.raises(InputError, match="does not fit by"):
        RuntimeBackend(EngineConfig(model=too_big, device="cpu", dtype="float32"))


def test_engine_check_passes_the_tiny_checkpoint(tiny_ckpt):
    from m3bench.runtime.engine_config import DeviceFacts, EngineConfig, resolve
    from m3bench.runtime.fit_check import check_config_fits

    plan = check_config_fits(resolve(EngineConfig(tiny_ckpt, device="cpu"), DeviceFacts(0)))
    assert plan.fits and plan.settings.dtype_bytes == 4 and plan.max_model_len == 2048
