"""The tiny MiniMax-M3 with real skill shipped in the wheel: the embedded default of the smoke runs.

    shipped_tiny_skill()          # target checkpoint dir: config.json, bf16 model.safetensors, tokenizer
    shipped_tiny_skill_eagle3()   # its Eagle3 draft, distilled on the same task set
    shipped_task_set()            # TaskSetId: seed, sizes and held-out sha256 of the task set it was trained on

Trained by benchmarks/train_tiny_skill.py (seeded) on the synthetic task set of m3bench/evals/synthetic.py
(every layer kind of M3: dense and MSA attention, dense and MoE MLPs). SKILL_DIR/README.md records the run.
Replacing the weights is one copy of a trained `ckpt/` into SKILL_DIR/target and `eagle3/` into SKILL_DIR/eagle3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SKILL_DIR = Path(__file__).resolve().parent / "assets" / "tiny-m3-skill"
TASK_SET_FILE = "task_set.json"


@dataclass(frozen=True)
class TaskSetId:
    """The synthetic task set a shipped model was trained on: regenerated bit for bit from seed and sizes."""

    seed: int
    sizes: dict[str, int]  # evals.synthetic.TaskSetSizes fields
    sha256: dict[str, str]  # "<dataset>/<split>" -> sha256 of the file write_task_set writes


def shipped_tiny_skill() -> Path:
    return SKILL_DIR / "target"


def shipped_tiny_skill_eagle3() -> Path:
    return SKILL_DIR / "eagle3"


def shipped_task_set() -> TaskSetId:
    raw = json.loads((SKILL_DIR / TASK_SET_FILE).read_text(encoding="utf-8"))
    return TaskSetId(int(raw["seed"]), dict(raw["sizes"]), dict(raw["sha256"]))
