"""`m3bench lm-eval`: lm-eval tasks on the bundled runtime; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app
from shared_data import SHARED_DATA as DATA_DIR

lm_eval = pytest.importorskip("lm_eval")
yaml = pytest.importorskip("yaml")

runner = CliRunner()
LM_TASKS = Path(lm_eval.__file__).parent / "tasks"


def one_line_error(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("m3bench: error: ") and needle in lines[0], result.stderr


def anatomy_task(root: Path, n: int) -> None:
    """lm-eval's own mmlu_anatomy config on n local rows (the hub is unreachable in tests)."""
    if not (DATA_DIR / "mmlu" / "test.jsonl").exists():
        pytest.skip(f"no local data at {DATA_DIR}")
    rows = [json.loads(x) for x in (DATA_DIR / "mmlu" / "test.jsonl").read_text().split("\n") if x.strip()]
    test = [r for r in rows if r["subject"] == "anatomy"][:n]
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    (root / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test[:1]))  # lm-eval loads fewshot_split
    own = yaml.safe_load((LM_TASKS / "mmlu" / "default" / "mmlu_anatomy.yaml").read_text())
    cfg = {"include": str(LM_TASKS / "mmlu" / "default" / "_default_template_yaml"), "task": "local_anatomy",
           "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(root / "test.jsonl"), "dev": str(root / "dev.jsonl")}},
           "description": own["description"]}
    (root / "local_anatomy.yaml").write_text(yaml.safe_dump(cfg))


def test_help_lists_the_options():
    result = runner.invoke(app, ["lm-eval", "--help"])
    assert result.exit_code == 0
    for option in ("--model", "--tasks", "--limit", "--num-fewshot", "--max-batch-size", "--output-path"):
        assert option in result.output


def test_bad_input_is_one_line(tmp_path):
    one_line_error(runner.invoke(app, ["lm-eval", "--model", str(tmp_path / "nope"), "--tasks", "mmlu"]),
                   "model directory not found")
    one_line_error(runner.invoke(app, ["lm-eval", "--model", str(tmp_path), "--tasks", "mmlu", "--log-samples"]),
                   "--log-samples needs --output-path")
    one_line_error(runner.invoke(app, ["lm-eval", "--model", str(tmp_path), "--tasks", " , "]), "at least one task")


def test_unknown_task_is_one_line(tmp_path):
    result = runner.invoke(app, ["lm-eval", "--model", str(tmp_path), "--tasks", "no_such_task_xyz",
                                 "--include-path", str(tmp_path)])
    one_line_error(result, "unknown lm-eval tasks ['no_such_task_xyz']")


def test_runs_a_local_task_end_to_end(smollm2_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks, out = tmp_path / "tasks", tmp_path / "out"
    tasks.mkdir()
    anatomy_task(tasks, n=3)
    result = runner.invoke(app, ["lm-eval", "--model", str(smollm2_dir), "--tasks", "local_anatomy",
                                 "--include-path", str(tasks), "--limit", "2", "--num-fewshot", "0",
                                 "--max-batch-size", "4", "--log-samples", "--output-path", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    acc = results["results"]["local_anatomy"]["acc,none"]
    samples = (out / "samples_local_anatomy.jsonl").read_text().splitlines()
    assert len(samples) == 2
    assert acc == pytest.approx(sum(json.loads(s)["acc"] for s in samples) / 2)
