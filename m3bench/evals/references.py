"""Reference accuracies and acceptance lengths (references/{mmlu,gsm8k,acceptance_length}.yaml).

    ref = find_accuracy_reference("gsm8k", "nvidia/MiniMax-M3-NVFP4", RunSpec(quant_algo="NVFP4"))
    gate = ref.gate(n=1319)          # threshold ref - 3.20, theta 4.84

A file maps a model id to a list of entries; an entry matches when each spec key equals the run's value
(absent = None); the first match wins; no match is an InputError listing what the file has.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from m3bench.evals.gate import DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_SIGMA, Gate, make_gate, sigma_from_reference
from m3bench.runtime.errors import InputError

SPEC_KEYS = ("quant_algo", "kv_cache_quant_algo", "spec_dec_algo", "extra_acc_spec")
ACCURACY_KEYS = frozenset({"accuracy", "alpha", "beta", "sigma", "num_samples", "threshold", "reference_note"})
ACCEPTANCE_KEYS = frozenset({"ref_al", "min_al", "acceptance_rate", "num_samples", "reference_note"})
SIGMA_FROM_REFERENCE = "from_reference"


@dataclass(frozen=True)
class RunSpec:
    """What a run is, in the reference files' terms (None = absent)."""

    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    spec_dec_algo: str | None = None
    extra_acc_spec: str | None = None

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in SPEC_KEYS if getattr(self, k) is not None]
        return ", ".join(parts) or "no spec keys"


@dataclass(frozen=True)
class AccuracyReference:
    model: str
    spec: RunSpec
    accuracy: float
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    sigma: float | str = DEFAULT_SIGMA  # a number, or "from_reference": 100 sqrt(p (1 - p))
    num_samples: int | None = None
    threshold: float | None = None  # explicit floor, replaces the computed threshold
    reference_note: str | None = None

    def gate(self, n: int) -> Gate:
        sigma = sigma_from_reference(self.accuracy) if self.sigma == SIGMA_FROM_REFERENCE else float(self.sigma)
        return make_gate(self.accuracy, n, sigma, self.alpha, self.beta, self.threshold)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "spec"}
        return {**out, **{k: getattr(self.spec, k) for k in SPEC_KEYS}}


@dataclass(frozen=True)
class AcceptanceReference:
    model: str
    spec: RunSpec
    ref_al: float
    min_al: float
    acceptance_rate: float | None = None
    num_samples: int | None = None
    reference_note: str | None = None


def _shipped(name: str):
    """A file of the package m3bench.references (repository folder references/, mapped by pyproject)."""
    try:
        return importlib.resources.files("m3bench.references").joinpath(name)
    except ModuleNotFoundError:  # editable installs do not map package-dir subpackages: source-tree layout
        import m3bench

        return Path(m3bench.__file__).resolve().parent.parent / "references" / name


def _read_yaml(task: str, path: Path | None) -> tuple[str, Any]:
    import yaml

    if path is None:
        where, text = f"m3bench.references/{task}.yaml", _shipped(f"{task}.yaml").read_text(encoding="utf-8")
    else:
        where, text = str(path), Path(path).read_text(encoding="utf-8")
    try:
        return where, yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InputError(f"{where}: malformed YAML ({str(e).splitlines()[0]})") from e


def _entry_fields(where: str, model: str, raw: Any, allowed: frozenset[str]) -> tuple[RunSpec, dict[str, Any]]:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: entry of {model!r} is not a mapping")
    unknown = set(raw) - allowed - set(SPEC_KEYS)
    if unknown:
        raise InputError(f"{where}: entry of {model!r} has unknown keys {sorted(unknown)}")
    spec = RunSpec(**{k: (None if raw.get(k) is None else str(raw[k])) for k in SPEC_KEYS})
    return spec, {k: v for k, v in raw.items() if k in allowed}


def _parse_entries(where: str, doc: Any, build) -> list:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: top level must map model ids to lists of entries")
    entries = []
    for model, items in doc.items():
        if not isinstance(items, list):
            raise InputError(f"{where}: {model!r} must hold a list of entries")
        entries.extend(build(str(model), item) for item in items)
    return entries


def _accuracy_entry(where: str):
    def build(model: str, raw: Any) -> AccuracyReference:
        spec, values = _entry_fields(where, model, raw, ACCURACY_KEYS)
        if not isinstance(values.get("accuracy"), (int, float)):
            raise InputError(f"{where}: entry of {model!r} ({spec.describe()}) needs a numeric accuracy")
        sigma = values.get("sigma", DEFAULT_SIGMA)
        if not (sigma == SIGMA_FROM_REFERENCE or isinstance(sigma, (int, float))):
            raise InputError(f"{where}: sigma must be a number or {SIGMA_FROM_REFERENCE!r}, got {sigma!r}")
        return AccuracyReference(model, spec, **values)

    return build


def _acceptance_entry(where: str):
    def build(model: str, raw: Any) -> AcceptanceReference:
        spec, values = _entry_fields(where, model, raw, ACCEPTANCE_KEYS)
        if "ref_al" not in values or "min_al" not in values:
            raise InputError(f"{where}: entry of {model!r} ({spec.describe()}) needs ref_al and min_al")
        return AcceptanceReference(model, spec, **values)

    return build


def load_accuracy_references(task: str, path: Path | None = None) -> tuple[str, list[AccuracyReference]]:
    """(where, entries) of `task`.yaml shipped in m3bench.references, or of --reference FILE."""
    where, doc = _read_yaml(task, path)
    return where, _parse_entries(where, doc, _accuracy_entry(where))


def load_acceptance_references(path: Path | None = None) -> tuple[str, list[AcceptanceReference]]:
    where, doc = _read_yaml("acceptance_length", path)
    return where, _parse_entries(where, doc, _acceptance_entry(where))


def match_reference(where: str, entries: list, model: str, spec: RunSpec):
    """First entry of `model` whose spec keys all equal the run's; InputError listing the entries if none."""
    for entry in entries:
        if entry.model == model and entry.spec == spec:
            return entry
    available = "; ".join(f"{e.model} [{e.spec.describe()}]" for e in entries) or "none"
    raise InputError(f"{where}: no reference for {model} [{spec.describe()}]; available: {available}")


def find_accuracy_reference(task: str, model: str, spec: RunSpec, path: Path | None = None) -> AccuracyReference:
    where, entries = load_accuracy_references(task, path)
    return match_reference(where, entries, model, spec)


def find_acceptance_reference(model: str, spec: RunSpec, path: Path | None = None) -> AcceptanceReference:
    where, entries = load_acceptance_references(path)
    return match_reference(where, entries, model, spec)
