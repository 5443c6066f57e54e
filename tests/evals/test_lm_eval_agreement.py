"""m3bench's `mmlu` and `gsm8k` against lm-evaluation-harness on SmolLM2-135M, item by item.

lm-eval runs its own `mmlu` / `gsm8k` task configs (included from the installed package) with the
dataset pointed at local json files cut from the shared data (the hub is unreachable), on its own
`hf` model. m3bench runs its protocols on the `hf` and `runtime` backends, and lm-eval runs again on
the `m3bench` model (the adapter). Prompts, per-item predictions and extracted answers must agree.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

lm_eval = pytest.importorskip("lm_eval")
yaml = pytest.importorskip("yaml")

from m3bench.evals.datasets import DatasetName, SourceKind, Split, load_split  # noqa: E402
from m3bench.evals.protocols.base import Settings  # noqa: E402
from m3bench.evals.protocols.gsm8k import Gsm8k  # noqa: E402
from m3bench.evals.protocols.mmlu import MmluLoglikelihood  # noqa: E402
from m3bench.evals.scoring import extract_flexible_last, extract_strict_first  # noqa: E402
from shared_data import SHARED_DATA as DATA_DIR

LM_TASKS = Path(lm_eval.__file__).parent / "tasks"


@dataclass(frozen=True)
class Case:
    """One agreement setting: MMLU subjects x items per subject, GSM8K items, shots, token budget."""

    subjects: tuple[str, ...]
    mmlu_items: int
    mmlu_shots: int
    gsm_items: int
    gsm_shots: int
    gsm_max_tokens: int


CHEAP = Case(("abstract_algebra", "anatomy"), 3, 1, 2, 1, 16)
SLOW = Case(("astronomy", "college_physics", "high_school_geography"), 8, 5, 4, 5, 64)


@pytest.fixture(autouse=True, scope="module")
def offline_env():
    if not (DATA_DIR / "mmlu" / "test.jsonl").exists():
        pytest.skip(f"no local data at {DATA_DIR} (set M3BENCH_DATA)")
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM")}
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    import torch

    torch.set_num_threads(1)
    yield
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


# ----------------------------------------------------------------------------- local data, both sides


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


def mmlu_rows(split: str, case: Case) -> dict[str, list[dict]]:
    rows = read_jsonl(DATA_DIR / "mmlu" / f"{split}.jsonl")
    limit = case.mmlu_items if split == "test" else None
    return {s: [r for r in rows if r["subject"] == s][:limit] for s in case.subjects}


def write_mmlu_tasks(root: Path, case: Case) -> list[str]:
    """One task per subject: lm-eval's own mmlu template and description, local json data."""
    test, dev = mmlu_rows("test", case), mmlu_rows("dev", case)
    names = []
    for s in case.subjects:
        own = yaml.safe_load((LM_TASKS / "mmlu" / "default" / f"mmlu_{s}.yaml").read_text())
        files = {"test": jsonl(root / f"{s}_test.jsonl", test[s]), "dev": jsonl(root / f"{s}_dev.jsonl", dev[s])}
        cfg = {"include": str(LM_TASKS / "mmlu" / "default" / "_default_template_yaml"), "task": f"local_mmlu_{s}",
               "dataset_path": "json", "dataset_kwargs": {"data_files": files}, "description": own["description"]}
        (root / f"local_mmlu_{s}.yaml").write_text(yaml.safe_dump(cfg))
        names.append(cfg["task"])
    return names


def write_gsm8k_task(root: Path, case: Case) -> str:
    test = read_jsonl(DATA_DIR / "gsm8k" / "test.jsonl")[: case.gsm_items]
    files = {"test": jsonl(root / "gsm_test.jsonl", test), "train": str(DATA_DIR / "gsm8k" / "train.jsonl")}
    cfg = {"include": str(LM_TASKS / "gsm8k" / "gsm8k.yaml"), "task": "local_gsm8k", "tag": [],
           "dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": files}}
    (root / "local_gsm8k.yaml").write_text(yaml.safe_dump(cfg))
    return cfg["task"]


def m3bench_split(dataset: DatasetName, split: str, subjects: tuple[str, ...] = (), n: int | None = None) -> Split:
    """The shared data through m3bench's loader, cut as lm-eval's files are: the first n rows (per subject)."""
    full = load_split(dataset, split, DATA_DIR, order=(SourceKind.LOCAL,))
    if subjects:
        rows = tuple(r for s in subjects for r in [r for r in full.rows if r.subject == s][:n])
    else:
        rows = full.rows[:n]
    return Split(full.dataset, full.split, rows, full.source)


# ----------------------------------------------------------------------------- lm-eval side


def lm_eval_samples(model: Any, tasks: list[str], root: Path, shots: int, **kw: Any) -> dict[str, list[dict]]:
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(root), include_defaults=False)
    out = lm_eval.simple_evaluate(model=model, tasks=tasks, task_manager=tm, num_fewshot=shots,
                                  log_samples=True, verbosity="ERROR", **kw)
    return out["samples"]


def lm_eval_mmlu_items(samples: dict[str, list[dict]]) -> dict[tuple[str, int], dict]:
    """(subject, doc_id) -> {"prompt", "logprobs", "pred"} from lm-eval's logged samples."""
    items = {}
    for task, rows in samples.items():
        for r in rows:
            lps = [float(x[0]) for x in r["filtered_resps"]]
            items[(task.removeprefix("local_mmlu_"), r["doc_id"])] = {
                "prompt": r["arguments"][0][0], "logprobs": lps, "pred": "ABCD"[lps.index(max(lps))]}
    return items


def lm_eval_gsm_items(samples: dict[str, list[dict]]) -> dict[int, dict]:
    """doc_id -> {"prompt", "text", "strict-match", "flexible-extract"}."""
    items: dict[int, dict] = {}
    for r in samples["local_gsm8k"]:
        item = items.setdefault(r["doc_id"], {"prompt": r["arguments"][0][0], "text": r["resps"][0][0]})
        item[r["filter"]] = r["filtered_resps"][0]
    return items


# ----------------------------------------------------------------------------- m3bench side


def m3bench_mmlu_items(backend: Any, case: Case) -> dict[tuple[str, int], dict]:
    splits = {"test": m3bench_split(DatasetName.MMLU, "test", case.subjects, case.mmlu_items),
              "dev": m3bench_split(DatasetName.MMLU, "dev")}
    proto = MmluLoglikelihood()
    items = proto.build_items(splits, Settings(num_fewshot=case.mmlu_shots))
    flat = [(item, req) for item in items for req in item.requests]
    results: dict[int, Any] = {}
    backend.score([req for _, req in flat], lambda i, r: results.__setitem__(i, r))
    out, first_row = {}, {}
    for n, item in enumerate(items):
        row = int(item.id.split("/")[1])
        doc_id = row - first_row.setdefault(item.group, row)
        outputs = [results[n * 4 + k] for k in range(4)]
        out[(item.group, doc_id)] = {"prompt": item.requests[0].context, "logprobs": [o.logprob for o in outputs],
                                     "pred": proto.judge(item, outputs).extracted}
    return out


def m3bench_gsm_items(backend: Any, case: Case) -> dict[int, dict]:
    splits = {"test": m3bench_split(DatasetName.GSM8K, "test", n=case.gsm_items),
              "train": m3bench_split(DatasetName.GSM8K, "train")}
    proto = Gsm8k()
    items = proto.build_items(splits, Settings(num_fewshot=case.gsm_shots, max_tokens=case.gsm_max_tokens))
    results: dict[int, Any] = {}
    backend.generate([it.requests[0] for it in items], lambda i, r: results.__setitem__(i, r))
    out = {}
    for n, item in enumerate(items):
        text = results[n].text
        out[int(item.id.split("/")[1])] = {"prompt": item.requests[0].prompt, "text": text,
                                           "strict-match": extract_strict_first(text),
                                           "flexible-extract": extract_flexible_last(text)}
    return out


# ----------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def hf_backend(smollm2_dir):
    from m3bench.evals.backends.hf import HFBackend, HFConfig

    return HFBackend(HFConfig(model_dir=smollm2_dir, batch_size=1))


@pytest.fixture(scope="module")
def runtime_backend(smollm2_dir):
    from m3bench.evals.backends.runtime import RuntimeBackend
    from m3bench.runtime.engine_config import EngineConfig

    return RuntimeBackend(EngineConfig(device="cpu", model=smollm2_dir, dtype="float32", max_batch_size=8))


@pytest.fixture(scope="module")
def adapter(smollm2_dir, runtime_backend):
    """lm-eval's `m3bench` model on the runtime engine already loaded."""
    from m3bench.evals.lm_eval_adapter import M3BenchLM

    return M3BenchLM(engine=runtime_backend.llm, pretrained=str(smollm2_dir))


def hf_model_args(smollm2_dir: Path) -> dict[str, Any]:
    return {"pretrained": str(smollm2_dir), "dtype": "float32", "device": "cpu"}


# fp32 weights on both sides; the runtime keeps its KV cache in bf16 (its CPU default), which moves
# logprobs by up to ~0.02: predictions must still agree, logprobs to that tolerance.
LOGPROB_TOL = {"hf": 2e-3, "runtime": 5e-2}


def run_side(request, backend_name: str):
    return request.getfixturevalue(f"{backend_name}_backend")


# ----------------------------------------------------------------------------- reference runs (cached)


@pytest.fixture(scope="module")
def reference(smollm2_dir, tmp_path_factory):
    """lm-eval `hf` results per case, computed once."""
    cache: dict[tuple[str, Case], Any] = {}

    def get(kind: str, case: Case):
        if (kind, case) not in cache:
            root = tmp_path_factory.mktemp(f"lm_eval_{kind}")
            if kind == "mmlu":
                samples = lm_eval_samples("hf", write_mmlu_tasks(root, case), root, case.mmlu_shots,
                                          model_args=hf_model_args(smollm2_dir), batch_size=4)
                cache[(kind, case)] = lm_eval_mmlu_items(samples)
            else:
                samples = lm_eval_samples("hf", [write_gsm8k_task(root, case)], root, case.gsm_shots,
                                          model_args=hf_model_args(smollm2_dir), batch_size=1,
                                          gen_kwargs={"max_gen_toks": case.gsm_max_tokens})
                cache[(kind, case)] = lm_eval_gsm_items(samples)
        return cache[(kind, case)]

    return get


def assert_mmlu_agrees(ours: dict, ref: dict, tol: float) -> None:
    assert ours.keys() == ref.keys()
    for key in ref:
        assert ours[key]["prompt"] == ref[key]["prompt"], key
        assert ours[key]["pred"] == ref[key]["pred"], (key, ours[key]["logprobs"], ref[key]["logprobs"])
        assert ours[key]["logprobs"] == pytest.approx(ref[key]["logprobs"], abs=tol), key


def assert_gsm_agrees(ours: dict, ref: dict) -> None:
    assert ours.keys() == ref.keys()
    for key in ref:
        assert ours[key]["prompt"] == ref[key]["prompt"], key
        assert ours[key]["text"] == ref[key]["text"], key
        assert ours[key]["strict-match"] == ref[key]["strict-match"], key
        assert ours[key]["flexible-extract"] == ref[key]["flexible-extract"], key


# ----------------------------------------------------------------------------- the checks

# the 5-shot case takes ~10 minutes on 2 cores: `extended`, which CI deselects (run it with -m extended)
SLOW_MARK = pytest.param(SLOW, marks=[pytest.mark.slow, pytest.mark.extended], id="slow")
CASES = [pytest.param(CHEAP, id="cheap"), SLOW_MARK]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend_name", ["hf", "runtime"])
def test_mmlu_predictions_equal_lm_eval(request, reference, backend_name, case):
    ours = m3bench_mmlu_items(run_side(request, backend_name), case)
    assert_mmlu_agrees(ours, reference("mmlu", case), tol=LOGPROB_TOL[backend_name])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend_name", ["hf", "runtime"])
def test_gsm8k_answers_equal_lm_eval(request, reference, backend_name, case):
    ours = m3bench_gsm_items(run_side(request, backend_name), case)
    assert_gsm_agrees(ours, reference("gsm8k", case))


@pytest.mark.parametrize("case", CASES)
def test_adapter_mmlu_equals_lm_eval_hf(adapter, reference, tmp_path, case):
    ours = lm_eval_mmlu_items(lm_eval_samples(adapter, write_mmlu_tasks(tmp_path, case), tmp_path, case.mmlu_shots))
    assert_mmlu_agrees(ours, reference("mmlu", case), tol=LOGPROB_TOL["runtime"])


@pytest.mark.parametrize("case", CASES)
def test_adapter_gsm8k_equals_lm_eval_hf(adapter, reference, tmp_path, case):
    samples = lm_eval_samples(adapter, [write_gsm8k_task(tmp_path, case)], tmp_path, case.gsm_shots,
                              gen_kwargs={"max_gen_toks": case.gsm_max_tokens})
    assert_gsm_agrees(lm_eval_gsm_items(samples), reference("gsm8k", case))
