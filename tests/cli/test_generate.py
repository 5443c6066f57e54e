"""`m3bench generate` through CliRunner on a tiny checkpoint."""

import json

import pytest
from typer.testing import CliRunner

from m3bench.cli.generate import parse_prompt_ids
from m3bench.cli.main import app
from m3bench.runtime.tiny import TinySpec, write_tiny_checkpoint

SPEC = TinySpec(vocab_size=512, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                rotary_dim=8, dense_intermediate_size=48, num_experts=4, top_k=2, intermediate_size=16,
                shared_intermediate_size=16, index_dim=16, block_size=16, max_position_embeddings=512)
FAST = ["--tokens-per-block", "16", "--kv-cache-dtype", "auto"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0, spec=SPEC)


def _run(*args):
    return CliRunner().invoke(app, ["generate", *map(str, args)])


def test_json_per_prompt(ckpt):
    r = _run("--model", ckpt, "--prompt", "hello", "--prompt-ids", "3,4,5", "--max-tokens", "5", "--json", *FAST)
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert len(recs) == 2
    for rec in recs:
        assert len(rec["token_ids"]) == len(rec["logprobs"]) <= 5 and isinstance(rec["text"], str)
        assert all(lp <= 0 for lp in rec["logprobs"])


def test_max_tokens_zero_prints_empty_outputs(ckpt):
    r = _run("--model", ckpt, "--prompt-ids", "3,4,5", "--max-tokens", "0", "--json", *FAST)
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout.strip())
    assert rec["token_ids"] == [] and rec["text"] == ""


def test_greedy_is_deterministic_and_matches_the_api(ckpt):
    args = ("--model", ckpt, "--prompt-ids", "7,8,9,10", "--max-tokens", "6", "--json", *FAST)
    a, b = _run(*args), _run(*args)
    assert a.exit_code == 0 and a.stdout == b.stdout
    from m3bench.runtime.llm import LLM, SamplingParams

    llm = LLM(ckpt, kv_cache_dtype="auto", tokens_per_block=16)
    ref = llm.generate([[7, 8, 9, 10]], SamplingParams(max_tokens=6))[0]
    assert json.loads(a.stdout)["token_ids"] == ref.token_ids


def test_chat_sampling_top_logprobs_and_dummy(ckpt, tmp_path):
    r = _run("--model", ckpt, "--prompt", "hi", "--chat", "--temperature", "0.8", "--top-k", "5", "--seed", "3",
             "--max-tokens", "4", "--logprobs", "2", "--json", *FAST)
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert all(len(t) == 2 for t in rec["top_logprobs"])
    (tmp_path / "config.json").write_text((ckpt / "config.json").read_text())
    r = _run("--model", tmp_path, "--load-format", "dummy", "--prompt-ids", "1,2", "--max-tokens", "3", *FAST)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("bad", [
    ["--model", "/no/such/dir", "--prompt", "x"],
    ["--prompt-ids", "1,x,3"],
    ["--prompt-ids", "1,99999"],
    [],
    ["--prompt-ids", "1", "--chat"],
    ["--prompt", "x", "--dtype", "float7"],
])
def test_bad_input_exits_2(ckpt, bad):
    args = bad if "--model" in bad else ["--model", ckpt, *bad]
    r = _run(*args, *FAST)
    assert r.exit_code == 2
    if "--dtype" not in bad:  # typer's own usage error is several lines
        assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr


def test_parse_prompt_ids():
    assert parse_prompt_ids(" 1, 2,3 ") == [1, 2, 3]
