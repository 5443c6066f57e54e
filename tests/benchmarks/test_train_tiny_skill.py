"""The synthetic task set (GSM8K / MMLU formats) and benchmarks/train_tiny_skill.py, on CPU. The script has
run on the H200 (benchmarks/tiny_skill_gpu.sh, docs/performance.md); here: it runs, learns, and its forward is
the reference model's."""

from __future__ import annotations

import hashlib
import importlib
import operator
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from m3bench.evals.datasets import DatasetName, load_split
from m3bench.evals.protocols import Task, get_protocol
from m3bench.evals.protocols.base import Settings
from m3bench.evals.protocols.mmlu_subjects import SUBJECTS
from m3bench.evals.runner import load_splits
from m3bench.evals.scoring import extract_strict_first, gsm8k_match
from m3bench.evals.synthetic import TaskSetSizes, read_train_rows, write_task_set

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
SIZES = TaskSetSizes(300, 60, 300, 60)
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _digest(root: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(root.rglob("*.jsonl")))).hexdigest()


def test_task_set_is_seeded_held_out_and_in_the_real_formats(tmp_path):
    a, b, c = (write_task_set(tmp_path / n, seed=s, sizes=SIZES) for n, s in (("a", 0), ("b", 0), ("c", 1)))
    assert _digest(a) == _digest(b) != _digest(c)
    gsm_train, mmlu_train = read_train_rows(a)
    gsm_test = load_split(DatasetName.GSM8K, "test", a).rows
    mmlu_test = load_split(DatasetName.MMLU, "test", a).rows
    assert not {r.question for r in gsm_train} & {r.question for r in gsm_test}
    assert not {(r.question, r.choices) for r in mmlu_train} & {(r.question, r.choices) for r in mmlu_test}
    for row in (*gsm_train, *gsm_test):  # calculator annotations are right and strict-match finds the answer
        for x, op, y, z in re.findall(r"<<(\d+)([+\-*])(\d+)=(\d+)>>", row.answer):
            assert OPS[op](int(x), int(y)) == int(z)
        assert gsm8k_match(extract_strict_first(row.answer), row.answer)
    for row in mmlu_test:
        assert row.subject in SUBJECTS and len(set(row.choices)) == 4
    letters = Counter(r.answer for r in mmlu_train)
    assert all(50 <= letters[i] <= 100 for i in range(4))  # spread evenly over A-D
    for task in Task:  # every protocol builds its items from it, 5-shot included
        protocol = get_protocol(task)
        settings = Settings(num_fewshot=5, limit=20)
        items = protocol.build_items(load_splits(protocol, settings, a), settings)
        assert len(items) == (4 if task is Task.MMLU_GEN else 20)  # mmlu-gen: ceil(20 / 57) per subject, 4 subjects


def test_batched_forward_is_the_reference_model(tmp_path):
    """The trainer's padded forward against m3bench.runtime.reference (float64, one sequence at a time)."""
    from m3bench.runtime.reference import reference_logits
    from m3bench.runtime.tiny import write_tiny_checkpoint
    from tiny_train_forward import batched_logits, check_dense_msa

    train = importlib.import_module("train_tiny_skill")
    cfg, w = train.initial_weights(write_tiny_checkpoint(tmp_path / "init", seed=0), "cpu")
    lengths = [37, 60, 12]
    ids = torch.randint(0, cfg.vocab_size, (3, 60), generator=torch.Generator().manual_seed(1))
    out = batched_logits(cfg, w, ids, torch.tensor(lengths)).detach()
    for b, n in enumerate(lengths):
        ref = reference_logits(cfg, w, ids[b, :n].tolist())
        assert (out[b, :n].double() - ref).abs().max() / ref.abs().max() < 1e-5
    with pytest.raises(ValueError, match="MSA would select"):
        check_dense_msa(cfg, cfg.msa.block_size * cfg.msa.topk_blocks + 1)


def test_training_lowers_the_loss_and_reaches_the_weights(tmp_path):
    train = importlib.import_module("train_tiny_skill")
    from transformers import AutoTokenizer

    from m3bench.runtime.tiny import write_tiny_checkpoint

    init = write_tiny_checkpoint(tmp_path / "init", seed=0)
    data = write_task_set(tmp_path / "data", seed=0, sizes=TaskSetSizes(32, 4, 32, 4))
    examples = train.examples(data, AutoTokenizer.from_pretrained(str(init)), 192)
    assert len(examples) == 2 * 32 + 2 * 32 and all(0 < n < len(ids) for ids, n in examples)
    cfg, w = train.initial_weights(init, "cpu")
    params = [t for t in w.values() if t.requires_grad]
    batch = examples[:3] + examples[-3:]
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    for _ in range(6):
        loss = train.batch_loss(cfg, w, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    frozen = {n for n, t in w.items() if t.grad is None or not t.grad.abs().sum()}
    assert frozen and all("index_" in n or "router.bias" in n for n in frozen)  # selections only


def test_cpu_smoke_run_writes_a_loadable_checkpoint(tmp_path):
    train = importlib.import_module("train_tiny_skill")
    from m3bench.runtime import LLM

    report = train.run(tmp_path, train.CPU_SMOKE, "cpu")
    assert report["losses_first_last"][0] > 0 and report["plan"]["seed"] == 0
    llm = LLM(report["checkpoint"], device="cpu", dtype="float32")
    (logprob, _), = llm.score([(llm.tokenizer.encode("Question: 2 + 3?\nAnswer:"), llm.tokenizer.encode(" 5"))])
    assert logprob < 0
    assert sum(p.stat().st_size for p in Path(report["checkpoint"]).glob("*.safetensors")) < 10 * 2**20
    from tiny_train_forward import batched_logits  # the saved weights are the trained ones, as the runtime reads them

    cfg, w = train.initial_weights(Path(report["checkpoint"]), "cpu")
    ids = llm.tokenizer.encode("Question: Ann has 3 pens. How many pens does Ann have?\nAnswer:")
    ours = batched_logits(cfg, w, torch.tensor([ids]), torch.tensor([len(ids)]))[0].detach()
    got = llm.score([(ids[:-1], ids[-1:])])[0][0]
    want = torch.log_softmax(ours[-2].double(), -1)[ids[-1]].item()
    assert abs(got - want) < 1e-3
