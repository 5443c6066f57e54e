"""`m3bench checkpoint distill-draft`: a (very short) distillation writes a draft the runtime loads; bad input
is one line and exit 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from m3bench.cli.main import app

runner = CliRunner()


def test_distill_draft_writes_a_loadable_draft(tmp_path):
    from m3bench.runtime import LLM, SamplingParams
    from m3bench.runtime.tiny import TinySpec, write_tiny_checkpoint

    spec = TinySpec(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, rotary_dim=8,
                    dense_intermediate_size=128, intermediate_size=32, shared_intermediate_size=32, index_dim=16)
    target = write_tiny_checkpoint(tmp_path / "t", seed=0, spec=spec)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"What is {i} + {i}?"}) + "\n" for i in range(6)))
    res = runner.invoke(app, ["checkpoint", "distill-draft", str(target), str(tmp_path / "d"), "--prompts-file",
                              str(prompts), "--num-prompts", "4", "--new-tokens", "8", "--steps", "3",
                              "--batch-size", "2"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "d" / "model.safetensors").is_file()
    llm = LLM(str(target), speculative_model=str(tmp_path / "d"), draft_len=2)
    out = llm.generate(["What is 1 + 1?"], SamplingParams(max_tokens=6, ignore_eos=True))
    assert len(out[0].token_ids) == 6 and llm.spec_stats().drafts > 0


def test_distill_draft_bad_input_exit_2(tmp_path):
    res = runner.invoke(app, ["checkpoint", "distill-draft", str(tmp_path / "missing"), str(tmp_path / "d")])
    assert res.exit_code == 2 and "does not exist" in res.output
    (tmp_path / "t").mkdir()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no question field"}\n')
    res = runner.invoke(app, ["checkpoint", "distill-draft", str(tmp_path / "t"), str(tmp_path / "d"),
                              "--prompts-file", str(bad)])
    assert res.exit_code == 2 and "no text field 'question'" in res.output
