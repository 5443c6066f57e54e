"""Reference files: schema, exact spec matching, first match wins, errors."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3bench.evals.protocols import Task, get_protocol
from m3bench.evals.protocols.base import Settings
from m3bench.evals.references import (
    AcceptanceProtocol, ProtocolSpec, RunSpec, find_acceptance_reference, find_accuracy_reference,
    load_acceptance_references, load_accuracy_references,
)
from m3bench.runtime.errors import InputError

P = "    protocol: gsm8k\n    protocol_version: v1\n    num_fewshot: 5\n    chat: false\n    max_tokens: 256\n"
GSM = ProtocolSpec("gsm8k", "v1", 5, False, 256)
YAML = f"""
org/model:
  - accuracy: 70.0
{P}  - kv_cache_quant_algo: FP8
    accuracy: 69.0
    sigma: from_reference
{P}  - kv_cache_quant_algo: FP8
    accuracy: 1.0
{P}  - spec_dec_algo: Eagle3
    extra_acc_spec: attention_dp
    accuracy: 68.0
    threshold: 60.0
{P}  - accuracy: 40.0
    protocol: gsm8k
    protocol_version: v1
    num_fewshot: 0
    chat: false
    max_tokens: 256
"""


@pytest.fixture
def ref_file(tmp_path: Path) -> Path:
    p = tmp_path / "ref.yaml"
    p.write_text(YAML)
    return p


def test_exact_match_and_first_wins(ref_file):
    assert find_accuracy_reference("gsm8k", "org/model", RunSpec(), GSM, ref_file).accuracy == 70.0
    fp8 = find_accuracy_reference("gsm8k", "org/model", RunSpec(kv_cache_quant_algo="FP8"), GSM, ref_file)
    assert fp8.accuracy == 69.0  # the later FP8 entry never wins
    assert fp8.gate(100).sigma == pytest.approx(100 * (0.69 * 0.31) ** 0.5)
    dp = find_accuracy_reference("gsm8k", "org/model", RunSpec(spec_dec_algo="Eagle3", extra_acc_spec="attention_dp"),
                                 GSM, ref_file)
    assert dp.gate(50).threshold == 60.0
    zero_shot = ProtocolSpec("gsm8k", "v1", 0, False, 256)
    assert find_accuracy_reference("gsm8k", "org/model", RunSpec(), zero_shot, ref_file).accuracy == 40.0


def test_a_golden_band_holds_only_at_its_own_sample_count():
    """A golden's fixed floor and ceiling are a few items either side of its own n-item run; a 1-item run once
    failed a 100% score against the 200-item band 79.5..81.5. At another n the hypothesis test at n decides."""
    from m3bench.evals.gate import Verdict
    from m3bench.evals.references import AccuracyReference

    golden = AccuracyReference("m", RunSpec(), GSM, accuracy=80.5, threshold=79.5, ceiling=81.5, num_samples=200)
    own = golden.gate(200)
    assert (own.threshold, own.ceiling) == (79.5, 81.5) and own.verdict(82.0) is Verdict.FAIL
    small = golden.gate(10)
    assert small.ceiling is None and small.threshold < 60 and small.verdict(100.0) is Verdict.PASS
    assert small.verdict(0.0) is Verdict.FAIL  # still able to fail
    unsized = AccuracyReference("m", RunSpec(), GSM, accuracy=68.0, threshold=60.0)
    assert unsized.gate(7).threshold == 60.0  # no num_samples: the floor holds at any n


@pytest.mark.parametrize("other", [
    ProtocolSpec("gsm8k", "v2", 5, False, 256), ProtocolSpec("gsm8k", "v1", 3, False, 256),
    ProtocolSpec("gsm8k", "v1", 5, True, 256), ProtocolSpec("gsm8k", "v1", 5, False, 512),
    ProtocolSpec("gsm8k-chat", "v1", 5, False, 256),
])
def test_any_protocol_difference_refuses_the_gate(ref_file, other):
    with pytest.raises(InputError, match="org/model has: .*gsm8k v1, 5-shot, no chat, max_tokens 256.*--no-reference"):
        find_accuracy_reference("gsm8k", "org/model", RunSpec(), other, ref_file)


def test_no_match_lists_entries(ref_file):
    with pytest.raises(InputError, match=r"org/model has: \[no spec keys\]"):
        find_accuracy_reference("gsm8k", "org/model", RunSpec(spec_dec_algo="Eagle3"), GSM, ref_file)  # DP key absent
    with pytest.raises(InputError, match="no reference for other/model.*other/model has: none; other models: org/model"):
        find_accuracy_reference("gsm8k", "other/model", RunSpec(), GSM, ref_file)


@pytest.mark.parametrize("text, message", [
    ("org/m: [unclosed", "malformed YAML"),
    ("org/m:\n  - accuracy: high\n", "numeric accuracy"),
    ("org/m:\n  - accuracy: 1\n    tp_size: 4\n", "unknown keys"),
    ("org/m:\n  - accuracy: 1\n", "states no protocol, protocol_version, num_fewshot, chat"),
    ("org/m:\n  - accuracy: 1\n" + P.replace("num_fewshot: 5", "num_fewshot: five"), "must be integers"),
    ("- 1\n- 2\n", "top level"),
    # figures that make a gate which cannot work: exit 3 (alpha 2, beta 1, a threshold of 'x') or a silent gate
    # (a threshold of -5 passes everything, a ceiling below the threshold fails everything, sigma -1)
    ("org/m:\n  - accuracy: 150\n" + P, "accuracy must be a score from 0 to 100, got 150"),
    ("org/m:\n  - accuracy: .nan\n" + P, "accuracy must be a score from 0 to 100"),
    ("org/m:\n  - accuracy: 80\n    alpha: 2\n" + P, "alpha must be a probability between 0 and 1"),
    ("org/m:\n  - accuracy: 80\n    beta: 1\n" + P, "beta must be a probability between 0 and 1"),
    ("org/m:\n  - accuracy: 80\n    sigma: -1\n" + P, "sigma must be above 0"),
    ("org/m:\n  - accuracy: 80\n    num_samples: 0\n" + P, "num_samples must be a count"),
    ("org/m:\n  - accuracy: 80\n    threshold: -5\n" + P, "threshold must be a score above 0"),
    ("org/m:\n  - accuracy: 80\n    threshold: x\n" + P, "threshold must be a score above 0"),
    ("org/m:\n  - accuracy: 80\n    threshold: 82\n    ceiling: 81\n" + P, "ceiling 81 is below threshold 82"),
])
def test_bad_files(tmp_path, text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(InputError, match=message):
        load_accuracy_references("mmlu", p)


AL = "org/m:\n  - spec_dec_algo: Eagle3\n    protocol: gsm8k-chat\n    draft_len: {d}\n    ref_al: {r}\n    min_al: {m}\n"


@pytest.mark.parametrize("d, r, m, message", [
    (3, 3.0, 1.0, "min_al 1.0 can never fail: every acceptance length is at least 1"),
    (3, 3.0, 0.5, "min_al must be an acceptance length from 1 to 4"),
    (3, 4.5, 3.0, "ref_al must be an acceptance length from 1 to 4 \\(1 \\+ draft_len\\), got 4.5"),
    (3, 2.0, 2.5, "min_al 2.5 is above ref_al 2.0"),
    (3, 3.0, "high", "min_al must be an acceptance length"),
    (0, 1.0, 1.0, "integer draft_len >= 1"),
])
def test_bad_acceptance_entries(tmp_path, d, r, m, message):
    """An acceptance gate that cannot fail (min_al <= 1: every AL is at least 1) or that no run can meet is bad
    input, named with its entry."""
    p = tmp_path / "al.yaml"
    p.write_text(AL.format(d=d, r=r, m=m))
    with pytest.raises(InputError, match=message):
        load_acceptance_references(p)
    p.write_text(AL.format(d=3, r=3.0, m=2.8))
    assert load_acceptance_references(p)[1][0].min_al == 2.8


def test_shipped_references():
    gen5 = get_protocol(Task.MMLU_GEN).measured_with(Settings())
    gsm5 = get_protocol(Task.GSM8K).measured_with(Settings())
    bf16 = find_accuracy_reference("gsm8k", "MiniMaxAI/MiniMax-M3", RunSpec(), gsm5)
    assert bf16.accuracy == 91.32 and bf16.gate(1319).threshold == pytest.approx(88.12, abs=0.01)
    dp = RunSpec(quant_algo="NVFP4", spec_dec_algo="Eagle3", extra_acc_spec="attention_dp")
    assert find_accuracy_reference("mmlu", "nvidia/MiniMax-M3-NVFP4", dp, gen5).accuracy == 85.11
    nv = AcceptanceProtocol("gsm8k-chat", 3)
    al = find_acceptance_reference("nvidia/MiniMax-M3-NVFP4", RunSpec(quant_algo="NVFP4", spec_dec_algo="Eagle3"), nv)
    assert (al.ref_al, al.acceptance_rate) == (3.528, 0.843) and al.min_al == pytest.approx(0.95 * al.ref_al, abs=0.01)


def test_the_tiny_m3_gsm8k_golden_fails_a_run_that_solves_an_item():
    """The random tiny checkpoint solves 0 of 8 (gsm8k 0-shot, 24 tokens): its golden's ceiling of 0 fails 1 of 8
    (12.5). It used to be a floor of 0.0, which no score could fail."""
    from m3bench.evals.gate import Verdict

    spec = get_protocol(Task.GSM8K).measured_with(Settings(num_fewshot=0, limit=8, max_tokens=24))
    golden = find_accuracy_reference("gsm8k", "m3bench/tiny-m3", RunSpec(), spec)
    gate = golden.gate(8)
    assert gate.can_fail and gate.verdict(0.0) is Verdict.PASS and gate.verdict(12.5) is Verdict.FAIL


def test_seed_figures_only_on_the_checkpoint_the_seed_measured():
    """The Eagle3 figures come from the NVFP4 checkpoint's test: the bf16 model carries none of them."""
    eagle = RunSpec(spec_dec_algo="Eagle3")
    for task, proto in (("mmlu", get_protocol(Task.MMLU_GEN)), ("gsm8k", get_protocol(Task.GSM8K))):
        with pytest.raises(InputError, match="no reference for MiniMaxAI/MiniMax-M3"):
            find_accuracy_reference(task, "MiniMaxAI/MiniMax-M3", eagle, proto.measured_with(Settings()))
    with pytest.raises(InputError, match="no reference for MiniMaxAI/MiniMax-M3"):
        find_acceptance_reference("MiniMaxAI/MiniMax-M3", eagle, AcceptanceProtocol("gsm8k-chat", 3))
    entries = [*load_accuracy_references("mmlu")[1], *load_accuracy_references("gsm8k")[1],
               *load_acceptance_references()[1]]
    assert all(e.source and e.source.split(":")[0] in ("seed", "golden") for e in entries)
    assert all("test_nvfp4_eagle3" in e.source and e.model == "nvidia/MiniMax-M3-NVFP4"
               for e in entries if e.spec.spec_dec_algo == "Eagle3" and e.source.startswith("seed"))


def test_every_shipped_accuracy_entry_matches_its_protocol():
    """Each shipped entry is reachable: its protocol is one a run of m3bench produces."""
    for task in ("mmlu", "gsm8k"):
        for e in load_accuracy_references(task)[1]:
            p = get_protocol(Task(e.protocol.protocol))
            settings = Settings(num_fewshot=e.protocol.num_fewshot, max_tokens=e.protocol.max_tokens)
            assert p.measured_with(settings) == e.protocol and p.dataset.value == task


def test_cli_malformed_reference_exits_2(tmp_path):
    from m3bench.cli.main import app

    bad = tmp_path / "bad.yaml"
    bad.write_text("org/m: [unclosed")
    args = ["accuracy", "--model", "served-name", "--backend", "openai", "--base-url", "http://127.0.0.1:9",
            "--task", "gsm8k", "--reference", str(bad), "--out", str(tmp_path / "out"), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "malformed YAML" in result.output


def _cli(tmp_path, *extra):
    from m3bench.cli.main import app
    from m3bench.runtime.tiny import write_tiny_checkpoint

    tiny = write_tiny_checkpoint(tmp_path / "tiny-m3")
    args = ["accuracy", "--model", str(tiny), "--model-id", "m3bench/tiny-m3", "--out", str(tmp_path / "out"),
            "--no-progress", "--device", "cpu", *extra]
    return CliRunner().invoke(app, args)


def test_cli_mmlu_gen_0_shot_is_not_gated_against_the_mmlu_golden(tmp_path):
    result = _cli(tmp_path, "--task", "mmlu-gen", "--num-fewshot", "0")
    assert result.exit_code == 2, result.output
    assert "measured with mmlu-gen trtllm-mmlu/m3bench-1, 0-shot" in result.output
    assert "m3bench/tiny-m3 has: [no spec keys] (mmlu lm-eval-mmlu-1.0/m3bench-1, 0-shot, no chat)" in result.output
    assert ("other models: MiniMaxAI/MiniMax-M3, m3bench/tiny-m3-skill, nvidia/MiniMax-M3-NVFP4. --no-reference runs "
            "it ungated") in result.output
    assert "Traceback" not in result.output


def test_cli_reference_and_no_reference_exclude_each_other(tmp_path):
    ref = tmp_path / "ref.yaml"
    ref.write_text("m3bench/tiny-m3: []\n")
    result = _cli(tmp_path, "--reference", str(ref), "--no-reference")
    assert result.exit_code == 2 and "contradict each other" in result.output


def test_smoke_run_honours_task_and_fewshot_and_refuses_another_protocols_golden(tmp_path, monkeypatch):
    """`m3bench accuracy --task mmlu-gen --num-fewshot 0` (no --model: the shipped trained tiny checkpoint) is exit 2,
    not a gate against the 0-shot loglikelihood `mmlu` golden."""
    from m3bench.cli.main import app

    monkeypatch.setenv("M3BENCH_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["accuracy", "--task", "mmlu-gen", "--num-fewshot", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "no reference for m3bench/tiny-m3-skill [no spec keys] measured with mmlu-gen" in result.output
