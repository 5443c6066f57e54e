"""Reference files: schema, exact spec matching, first match wins, errors."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3bench.evals.references import (
    RunSpec, find_acceptance_reference, find_accuracy_reference, load_accuracy_references,
)
from m3bench.runtime.errors import InputError

YAML = """
org/model:
  - accuracy: 70.0
  - kv_cache_quant_algo: FP8
    accuracy: 69.0
    sigma: from_reference
  - kv_cache_quant_algo: FP8
    accuracy: 1.0
  - spec_dec_algo: Eagle3
    extra_acc_spec: attention_dp
    accuracy: 68.0
    threshold: 60.0
"""


@pytest.fixture
def ref_file(tmp_path: Path) -> Path:
    p = tmp_path / "ref.yaml"
    p.write_text(YAML)
    return p


def test_exact_match_and_first_wins(ref_file):
    assert find_accuracy_reference("gsm8k", "org/model", RunSpec(), ref_file).accuracy == 70.0
    fp8 = find_accuracy_reference("gsm8k", "org/model", RunSpec(kv_cache_quant_algo="FP8"), ref_file)
    assert fp8.accuracy == 69.0  # the later FP8 entry never wins
    assert fp8.gate(100).sigma == pytest.approx(100 * (0.69 * 0.31) ** 0.5)
    dp = find_accuracy_reference("gsm8k", "org/model", RunSpec(spec_dec_algo="Eagle3", extra_acc_spec="attention_dp"), ref_file)
    assert dp.gate(50).threshold == 60.0


def test_no_match_lists_entries(ref_file):
    with pytest.raises(InputError, match="available: org/model"):
        find_accuracy_reference("gsm8k", "org/model", RunSpec(spec_dec_algo="Eagle3"), ref_file)  # DP key absent
    with pytest.raises(InputError, match="no reference for other/model"):
        find_accuracy_reference("gsm8k", "other/model", RunSpec(), ref_file)


@pytest.mark.parametrize("text, message", [
    ("org/m: [unclosed", "malformed YAML"),
    ("org/m:\n  - accuracy: high\n", "numeric accuracy"),
    ("org/m:\n  - accuracy: 1\n    tp_size: 4\n", "unknown keys"),
    ("- 1\n- 2\n", "top level"),
])
def test_bad_files(tmp_path, text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(InputError, match=message):
        load_accuracy_references("mmlu", p)


def test_shipped_references():
    nv = find_accuracy_reference("gsm8k", "nvidia/MiniMax-M3-NVFP4", RunSpec(quant_algo="NVFP4"))
    assert nv.accuracy == 91.32 and nv.gate(1319).threshold == pytest.approx(88.12, abs=0.01)
    dp = RunSpec(quant_algo="NVFP4", spec_dec_algo="Eagle3", extra_acc_spec="attention_dp")
    assert find_accuracy_reference("mmlu", "nvidia/MiniMax-M3-NVFP4", dp).accuracy == 85.11
    al = find_acceptance_reference("MiniMaxAI/MiniMax-M3", RunSpec(spec_dec_algo="Eagle3"))
    assert (al.ref_al, al.acceptance_rate) == (3.528, 0.843) and al.min_al == pytest.approx(0.95 * al.ref_al, abs=0.01)


def test_cli_malformed_reference_exits_2(tmp_path):
    from m3bench.cli.main import app

    bad = tmp_path / "bad.yaml"
    bad.write_text("org/m: [unclosed")
    args = ["accuracy", "--model", "served-name", "--backend", "openai", "--base-url", "http://127.0.0.1:9",
            "--task", "gsm8k", "--reference", str(bad), "--out", str(tmp_path / "out"), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "malformed YAML" in result.output
