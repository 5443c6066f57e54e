"""Prompts, item selection and judging of each protocol (prompts checked against lm-eval's own tasks)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from m3bench.evals.backends.base import GenResult, ScoreResult
from m3bench.evals.datasets import DatasetName, SourceKind, load_split
from m3bench.evals.protocols import Task, get_protocol
from m3bench.evals.protocols.base import Settings, stratified_prefix
from m3bench.evals.protocols.mmlu_gen import trtllm_sample
from m3bench.evals.protocols.mmlu_subjects import CATEGORY_OF, SUBJECTS, lm_eval_header
from m3bench.runtime.errors import InputError
from shared_data import SHARED_DATA as SHARED

pytestmark = pytest.mark.skipif(not (SHARED / "gsm8k" / "train.jsonl").is_file(), reason="no shared data copy")


def splits(dataset: DatasetName, *names: str) -> dict:
    return {n: load_split(dataset, n, SHARED, order=[SourceKind.LOCAL]) for n in names}


@pytest.fixture(scope="module")
def mmlu():
    return splits(DatasetName.MMLU, "test", "dev")


@pytest.fixture(scope="module")
def gsm():
    return splits(DatasetName.GSM8K, "test", "train")


def _lm_eval_task(cfg: dict, data_files: dict):
    lm_task = pytest.importorskip("lm_eval.api.task")
    cfg = {**cfg, "dataset_path": "json", "dataset_kwargs": {"data_files": data_files}}
    cfg.pop("dataset_name", None), cfg.pop("tag", None), cfg.pop("include", None)
    task = lm_task.ConfigurableTask(config=cfg)
    task.set_fewshot_seed(1234)  # lm-eval's default fewshot_random_seed
    return task


def test_gsm8k_prompts_equal_lm_eval(gsm):
    yaml = pytest.importorskip("yaml")
    import lm_eval

    cfg = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks/gsm8k/gsm8k.yaml").read_text())
    task = _lm_eval_task(cfg, {"train": str(SHARED / "gsm8k/train.jsonl"), "test": str(SHARED / "gsm8k/test.jsonl")})
    task.build_all_requests(limit=4, rank=0, world_size=1)
    theirs = [inst.args[0] for inst in task.instances]
    ours = {it.id: it.requests[0] for it in get_protocol(Task.GSM8K).build_items(gsm, Settings())}
    assert [ours[f"test/{i}"].prompt for i in range(4)] == theirs
    assert ours["test/0"].stop == tuple(task.instances[0].args[1]["until"]) and ours["test/0"].max_tokens == 256


def test_mmlu_prompts_equal_lm_eval(mmlu, tmp_path):
    yaml = pytest.importorskip("yaml")
    import lm_eval

    base = Path(lm_eval.__file__).parent / "tasks/mmlu/default"
    cfg = {**yaml.safe_load((base / "_default_template_yaml").read_text()),
           **yaml.safe_load((base / "mmlu_college_physics.yaml").read_text()), "num_fewshot": 5}
    files = {}
    for name in ("test", "dev"):
        rows = [r for r in mmlu[name].rows if r.subject == "college_physics"]
        files[name] = str(tmp_path / f"{name}.jsonl")
        Path(files[name]).write_text("".join(json.dumps({"question": r.question, "subject": r.subject,
                                                          "choices": list(r.choices), "answer": r.answer}) + "\n" for r in rows))
    task = _lm_eval_task(cfg, files)
    task.build_all_requests(limit=3, rank=0, world_size=1)
    theirs = [(i.args[0], i.args[1]) for i in task.instances]  # 4 (context, continuation) per doc
    items = [it for it in get_protocol(Task.MMLU).build_items(mmlu, Settings(num_fewshot=5)) if it.group == "college_physics"]
    ours = [(r.context, r.continuation) for it in items[:3] for r in it.requests]
    assert ours == theirs


def test_mmlu_headers_and_categories_match_lm_eval_yaml():
    yaml = pytest.importorskip("yaml")
    import lm_eval

    base = Path(lm_eval.__file__).parent / "tasks/mmlu/default"
    for subject in SUBJECTS:
        cfg = yaml.safe_load((base / f"mmlu_{subject}.yaml").read_text())
        assert cfg["description"] == lm_eval_header(subject)
        assert cfg["tag"] == f"mmlu_{CATEGORY_OF[subject].value}_tasks"
    assert len(SUBJECTS) == 57


def test_mmlu_gen_trtllm_format_and_sampling(mmlu):
    items = get_protocol(Task.MMLU_GEN).build_items(mmlu, Settings(limit=4096))
    assert len(items) == 57 * math.ceil(4096 / 57) == 4104
    assert len({it.id for it in items}) == 4104
    prompt = items[0].requests[0].prompt
    assert prompt.startswith("The following are multiple choice questions (with answers) about  abstract algebra.\n\n")
    assert prompt.count("\nAnswer:") == 6 and prompt.endswith("\nAnswer:") and items[0].requests[0].max_tokens == 2
    again = trtllm_sample(mmlu["test"].rows, 4096, 0)
    assert [f"test/{i}" for i in again] == [it.id for it in items]  # one RandomState(0), deterministic


def test_stratified_limit_is_proportional_and_prefix_stable(mmlu):
    groups = [r.subject for r in mmlu["test"].rows]
    a, b = stratified_prefix(groups, 1404, 0), stratified_prefix(groups, 2000, 0)
    assert b[:1404] == a and len(set(a)) == 1404
    law = sum(groups[i] == "professional_law" for i in a)  # 1534 of 14042 rows
    assert abs(law - 1404 * 1534 / 14042) <= 2


def test_fewshot_needs_its_split(mmlu, gsm):
    with pytest.raises(InputError, match="dev split"):
        get_protocol(Task.MMLU).build_items({"test": mmlu["test"]}, Settings(num_fewshot=5))
    with pytest.raises(InputError, match="train split"):
        get_protocol(Task.GSM8K).build_items({"test": gsm["test"]}, Settings())
    assert get_protocol(Task.GSM8K).build_items({"test": gsm["test"]}, Settings(num_fewshot=0, limit=2))


def test_judges_on_hand_made_outputs(mmlu, gsm):
    mm = get_protocol(Task.MMLU).build_items(mmlu, Settings(limit=1))[0]
    gold = "ABCD".index(mm.gold)
    scores = [ScoreResult(-5.0 + (3.0 if k == gold else 0.0), k == gold) for k in range(4)]
    assert get_protocol(Task.MMLU).judge(mm, scores).value == 1.0

    gen = get_protocol(Task.MMLU_GEN).build_items(mmlu, Settings(limit=57))[0]
    assert get_protocol(Task.MMLU_GEN).judge(gen, [GenResult(f" {gen.gold}\n", "length")]).value == 1.0

    g = get_protocol(Task.GSM8K)
    item = g.build_items(gsm, Settings(limit=1))[0]
    number = item.gold.split("#### ")[-1]
    both = g.judge(item, [GenResult(f"work...\n#### {number}", "stop")])
    flex_only = g.judge(item, [GenResult(f"so it is ${number}.", "stop")])
    assert (both.value, both.correct["strict-match"]) == (1.0, True)
    assert (flex_only.value, flex_only.correct) == (0.5, {"strict-match": False, "flexible-extract": True})

    chat = get_protocol(Task.GSM8K_CHAT)
    citem = chat.build_items(gsm, Settings(limit=1))[0]
    msgs = citem.requests[0].messages
    assert len(msgs) == 11 and msgs[-1]["content"].endswith("formatted as: #### [number]\nAnswer:")
    verdict = chat.judge(citem, [GenResult(f"#### 1\nrecheck\n#### {number}", "length")])
    assert verdict.value == 1.0 and verdict.cap_hit


def test_mmlu_gen_sampling_equals_pandas_sample_on_seeded_numpy(mmlu):
    """TensorRT-LLM: np.random seeded with 0, then `test_df.sample(ceil(n/57))` per subject in order."""
    import numpy as np
    import pandas as pd

    rows = mmlu["test"].rows
    state = np.random.get_state()
    try:
        np.random.seed(0)
        theirs = []
        for subject in SUBJECTS:
            df = pd.DataFrame({"i": [i for i, r in enumerate(rows) if r.subject == subject]})
            theirs += list(df.sample(72)["i"]) if len(df) > 72 else list(df["i"])
    finally:
        np.random.set_state(state)
    assert trtllm_sample(rows, 4096, 0) == theirs
