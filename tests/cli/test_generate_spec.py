"""`m3bench generate --draft`: the same greedy tokens as without speculation, and the acceptance figures."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from m3bench.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen-pair")
    res = runner.invoke(app, ["checkpoint", "tiny", str(root / "m3"), "--draft", str(root / "d"), "--seed", "3"])
    assert res.exit_code == 0, res.output
    return root / "m3", root / "d"


def _tokens(res) -> list[list[int]]:
    return [json.loads(line)["token_ids"] for line in res.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_generate_with_draft_is_lossless_and_reports_acceptance(pair, layout):
    model, draft = pair
    base = ["generate", "--model", str(model), "--prompt-ids", "5,9,200,31,7", "--prompt-ids", "1,2,3",
            "--max-tokens", "10", "--json"]
    plain = runner.invoke(app, base)
    spec = runner.invoke(app, base + ["--draft", str(draft), "--draft-len", "2", "--draft-kv", layout])
    assert plain.exit_code == 0 and spec.exit_code == 0, spec.output
    assert _tokens(spec) == _tokens(plain) and len(_tokens(spec)) == 2
    assert "acceptance rate" in spec.output and "acceptance length" in spec.output
    assert all("spec" in json.loads(line) for line in spec.stdout.splitlines() if line.startswith("{"))


def test_generate_bad_draft_is_exit_two(pair, tmp_path):
    model, _ = pair
    res = runner.invoke(app, ["generate", "--model", str(model), "--prompt-ids", "1,2", "--draft", str(tmp_path / "x")])
    assert res.exit_code == 2 and "does not exist" in res.output
