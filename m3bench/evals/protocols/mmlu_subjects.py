"""The 57 MMLU subjects and their four categories (lm-evaluation-harness `mmlu_*` group tags)."""

from __future__ import annotations

from enum import Enum


class MmluCategory(str, Enum):
    STEM = "stem"
    HUMANITIES = "humanities"
    SOCIAL_SCIENCES = "social_sciences"
    OTHER = "other"


_BY_CATEGORY = {
    MmluCategory.STEM: (
        "abstract_algebra anatomy astronomy college_biology college_chemistry college_computer_science "
        "college_mathematics college_physics computer_security conceptual_physics electrical_engineering "
        "elementary_mathematics high_school_biology high_school_chemistry high_school_computer_science "
        "high_school_mathematics high_school_physics high_school_statistics machine_learning"
    ),
    MmluCategory.HUMANITIES: (
        "formal_logic high_school_european_history high_school_us_history high_school_world_history "
        "international_law jurisprudence logical_fallacies moral_disputes moral_scenarios philosophy "
        "prehistory professional_law world_religions"
    ),
    MmluCategory.SOCIAL_SCIENCES: (
        "econometrics high_school_geography high_school_government_and_politics high_school_macroeconomics "
        "high_school_microeconomics high_school_psychology human_sexuality professional_psychology "
        "public_relations security_studies sociology us_foreign_policy"
    ),
    MmluCategory.OTHER: (
        "business_ethics clinical_knowledge college_medicine global_facts human_aging management marketing "
        "medical_genetics miscellaneous nutrition professional_accounting professional_medicine virology"
    ),
}

CATEGORY_OF: dict[str, MmluCategory] = {s: c for c, names in _BY_CATEGORY.items() for s in names.split()}
SUBJECTS: tuple[str, ...] = tuple(sorted(CATEGORY_OF))
LETTERS = ("A", "B", "C", "D")


def lm_eval_header(subject: str) -> str:
    """lm-eval's task description: subject with spaces."""
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
