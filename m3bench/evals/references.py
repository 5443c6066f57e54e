"""Reference accuracies and acceptance lengths (references/{mmlu,gsm8k,acceptance_length}.yaml).

    proto = ProtocolSpec("gsm8k", "lm-eval-gsm8k-3.0/m3bench-1", num_fewshot=5, chat=False, max_tokens=256)
    ref = find_accuracy_reference("gsm8k", "MiniMaxAI/MiniMax-M3", RunSpec(), proto)
    gate = ref.gate(n=1319)          # threshold ref - 3.20, theta 4.84

A file maps a model id to a list of entries; an entry states the protocol it was measured with
(accuracy: protocol, protocol_version, num_fewshot, chat, max_tokens where the cap matters; acceptance:
protocol, draft_len) and its spec keys. It matches when its protocol and each spec key equal the run's
(absent = None); the first match wins; no match is an InputError listing what the file has, protocols
included: a run is never gated against another protocol's figure. `source` says where a figure comes from.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from m3bench.evals.gate import DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_SIGMA, Gate, make_gate, sigma_from_reference
from m3bench.numbers import is_finite_number, is_int
from m3bench.runtime.errors import InputError

SPEC_KEYS = ("quant_algo", "kv_cache_quant_algo", "spec_dec_algo", "extra_acc_spec")
PROTOCOL_KEYS = ("protocol", "protocol_version", "num_fewshot", "chat", "max_tokens")
REQUIRED_PROTOCOL_KEYS = ("protocol", "protocol_version", "num_fewshot", "chat")
ACCEPTANCE_PROTOCOL_KEYS = ("protocol", "draft_len")
ACCURACY_KEYS = frozenset({"accuracy", "alpha", "beta", "sigma", "num_samples", "threshold", "ceiling", "reference_note",
                           "source"})
ACCEPTANCE_KEYS = frozenset({"ref_al", "min_al", "acceptance_rate", "num_samples", "reference_note", "source"})
SIGMA_FROM_REFERENCE = "from_reference"
ATTENTION_DP = "attention_dp"  # the extra_acc_spec of the seed's attention-DP figures


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


def extra_acc_spec_of(asked: str | None, attention_dp: bool, engine_is_the_run: bool = True) -> str | None:
    """The run's extra_acc_spec: `attention_dp` when its engine runs attention DP (EngineConfig.attention_dp),
    else what --extra-acc-spec asked. `engine_is_the_run` False (a server at --base-url): the engine flags do not
    describe the run, so the asked key stands alone."""
    if attention_dp and asked not in (None, ATTENTION_DP):
        raise InputError(f"--attention-dp runs are extra_acc_spec {ATTENTION_DP}, not --extra-acc-spec {asked}")
    if asked == ATTENTION_DP and not attention_dp and engine_is_the_run:
        raise InputError(f"--extra-acc-spec {ATTENTION_DP} gates against attention-DP figures: run the engine with "
                         "--attention-dp --tp N")
    return ATTENTION_DP if attention_dp else asked


@dataclass(frozen=True)
class ProtocolSpec:
    """How an accuracy figure was measured; a run is gated only against an entry with an equal one."""

    protocol: str  # the task: mmlu, mmlu-gen, gsm8k, gsm8k-chat
    protocol_version: str
    num_fewshot: int
    chat: bool
    max_tokens: int | None = None  # generation cap where it matters (None: loglikelihood scoring)

    def describe(self) -> str:
        cap = "" if self.max_tokens is None else f", max_tokens {self.max_tokens}"
        return f"{self.protocol} {self.protocol_version}, {self.num_fewshot}-shot, {'chat' if self.chat else 'no chat'}{cap}"


@dataclass(frozen=True)
class AcceptanceProtocol:
    """How an acceptance length was measured: the prompt set and the draft tokens per step."""

    protocol: str  # gsm8k-chat
    draft_len: int

    def describe(self) -> str:
        return f"{self.protocol}, draft_len {self.draft_len}"


@dataclass(frozen=True)
class AccuracyReference:
    model: str
    spec: RunSpec
    protocol: ProtocolSpec
    accuracy: float
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    sigma: float | str = DEFAULT_SIGMA  # a number, or "from_reference": 100 sqrt(p (1 - p))
    num_samples: int | None = None
    threshold: float | None = None  # explicit floor, replaces the computed threshold
    reference_note: str | None = None
    source: str | None = None  # where the figure comes from (seed test, golden smoke run)
    ceiling: float | None = None  # a golden of a deterministic run: scores above it fail too

    def gate(self, n: int) -> Gate:
        """The gate at n samples. A fixed threshold / ceiling (a golden's band, a few items either side of its
        own run) holds only at the reference's num_samples; at another n the hypothesis test at n decides."""
        sigma = sigma_from_reference(self.accuracy) if self.sigma == SIGMA_FROM_REFERENCE else float(self.sigma)
        if self.num_samples is not None and n != self.num_samples:
            return make_gate(self.accuracy, n, sigma, self.alpha, self.beta)
        return make_gate(self.accuracy, n, sigma, self.alpha, self.beta, self.threshold, self.ceiling)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("spec", "protocol")}
        return {**out, **{k: getattr(self.spec, k) for k in SPEC_KEYS}, **asdict(self.protocol)}


@dataclass(frozen=True)
class AcceptanceReference:
    model: str
    spec: RunSpec
    protocol: AcceptanceProtocol
    ref_al: float
    min_al: float
    acceptance_rate: float | None = None
    num_samples: int | None = None
    reference_note: str | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("spec", "protocol")}
        return {**out, **{k: getattr(self.spec, k) for k in SPEC_KEYS}, **asdict(self.protocol)}


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


def _entry_fields(where: str, model: str, raw: Any, allowed: frozenset[str],
                  protocol_keys: tuple[str, ...]) -> tuple[RunSpec, dict[str, Any], dict[str, Any]]:
    """(spec keys, value keys, protocol keys) of one entry; unknown keys are an InputError."""
    if not isinstance(raw, dict):
        raise InputError(f"{where}: entry of {model!r} is not a mapping")
    unknown = set(raw) - allowed - set(SPEC_KEYS) - set(protocol_keys)
    if unknown:
        raise InputError(f"{where}: entry of {model!r} has unknown keys {sorted(unknown)}")
    spec = RunSpec(**{k: (None if raw.get(k) is None else str(raw[k])) for k in SPEC_KEYS})
    values = {k: v for k, v in raw.items() if k in allowed}
    return spec, values, {k: raw.get(k) for k in protocol_keys}


def _protocol_of(where: str, model: str, spec: RunSpec, raw: dict[str, Any]) -> ProtocolSpec:
    """The entry's measurement protocol; every key but max_tokens must be stated, with its type."""
    missing = [k for k in REQUIRED_PROTOCOL_KEYS if raw.get(k) is None]
    if missing:
        raise InputError(f"{where}: entry of {model!r} ({spec.describe()}) states no {', '.join(missing)} "
                         f"(the protocol it was measured with: {', '.join(PROTOCOL_KEYS)})")
    fewshot, chat, cap = raw["num_fewshot"], raw["chat"], raw.get("max_tokens")
    if not is_int(fewshot) or not isinstance(chat, bool) or not (cap is None or is_int(cap)):
        raise InputError(f"{where}: entry of {model!r}: num_fewshot and max_tokens must be integers, chat true or false")
    return ProtocolSpec(str(raw["protocol"]), str(raw["protocol_version"]), fewshot, chat, cap)


def _acceptance_protocol_of(where: str, model: str, spec: RunSpec, raw: dict[str, Any]) -> AcceptanceProtocol:
    if raw.get("protocol") is None or not is_int(raw.get("draft_len")) or raw["draft_len"] < 1:
        raise InputError(f"{where}: entry of {model!r} ({spec.describe()}) needs protocol and an integer draft_len "
                         ">= 1 (how its acceptance length was measured)")
    return AcceptanceProtocol(str(raw["protocol"]), raw["draft_len"])


def _check_accuracy(what: str, values: dict[str, Any]) -> None:
    """The figures of an accuracy entry make a gate that can pass and fail: scores on 0-100, alpha / beta
    probabilities, a positive sigma, num_samples a count, a fixed threshold above 0 (at or below it no score fails)
    and not above the ceiling (above it every score fails)."""
    def bad(key: str, want: str) -> InputError:
        return InputError(f"{what}: {key} must be {want}, got {values[key]!r}")

    for key in ("accuracy", "ceiling"):
        if key in values and not (is_finite_number(values[key]) and 0.0 <= values[key] <= 100.0):
            raise bad(key, "a score from 0 to 100")
    for key in ("alpha", "beta"):
        if key in values and not (is_finite_number(values[key]) and 0.0 < values[key] < 1.0):
            raise bad(key, "a probability between 0 and 1")
    if is_finite_number(values.get("sigma")) and values["sigma"] <= 0:
        raise bad("sigma", "above 0")
    if "num_samples" in values and not (is_int(values["num_samples"]) and values["num_samples"] >= 1):
        raise bad("num_samples", "a count of items (>= 1)")
    if "threshold" in values and not (is_finite_number(values["threshold"]) and 0.0 < values["threshold"] <= 100.0):
        raise bad("threshold", "a score above 0 and at most 100 (no score fails a threshold of 0)")
    if "threshold" in values and "ceiling" in values and values["ceiling"] < values["threshold"]:
        raise InputError(f"{what}: ceiling {values['ceiling']} is below threshold {values['threshold']}: every "
                         "score would fail")


def _check_al(what: str, values: dict[str, Any], draft_len: int) -> None:
    """ref_al and min_al are acceptance lengths a run of draft_len can measure (AL = 1 + accepted / drafts: 1 to
    1 + draft_len), min_al above 1 (every run's AL is at least 1, so a lower gate cannot fail) and at most ref_al."""
    top = 1 + draft_len
    for key in ("ref_al", "min_al"):
        v = values[key]
        if not (is_finite_number(v) and 1.0 <= v <= top):
            raise InputError(f"{what}: {key} must be an acceptance length from 1 to {top} (1 + draft_len), got {v!r}")
    if values["min_al"] <= 1.0:
        raise InputError(f"{what}: min_al {values['min_al']} can never fail: every acceptance length is at least 1")
    if values["min_al"] > values["ref_al"]:
        raise InputError(f"{what}: min_al {values['min_al']} is above ref_al {values['ref_al']}")


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
        spec, values, proto = _entry_fields(where, model, raw, ACCURACY_KEYS, PROTOCOL_KEYS)
        if not isinstance(values.get("accuracy"), (int, float)):
            raise InputError(f"{where}: entry of {model!r} ({spec.describe()}) needs a numeric accuracy")
        sigma = values.get("sigma", DEFAULT_SIGMA)
        if not (sigma == SIGMA_FROM_REFERENCE or is_finite_number(sigma)):
            raise InputError(f"{where}: sigma must be a number or {SIGMA_FROM_REFERENCE!r}, got {sigma!r}")
        _check_accuracy(f"{where}: entry of {model!r} ({spec.describe()})", values)
        return AccuracyReference(model, spec, _protocol_of(where, model, spec, proto), **values)

    return build


def _acceptance_entry(where: str):
    def build(model: str, raw: Any) -> AcceptanceReference:
        spec, values, proto = _entry_fields(where, model, raw, ACCEPTANCE_KEYS, ACCEPTANCE_PROTOCOL_KEYS)
        if "ref_al" not in values or "min_al" not in values:
            raise InputError(f"{where}: entry of {model!r} ({spec.describe()}) needs ref_al and min_al")
        protocol = _acceptance_protocol_of(where, model, spec, proto)
        _check_al(f"{where}: entry of {model!r} ({spec.describe()})", values, protocol.draft_len)
        return AcceptanceReference(model, spec, protocol, **values)

    return build


def load_accuracy_references(task: str, path: Path | None = None) -> tuple[str, list[AccuracyReference]]:
    """(where, entries) of `task`.yaml shipped in m3bench.references, or of --reference FILE."""
    where, doc = _read_yaml(task, path)
    return where, _parse_entries(where, doc, _accuracy_entry(where))


def load_acceptance_references(path: Path | None = None) -> tuple[str, list[AcceptanceReference]]:
    where, doc = _read_yaml("acceptance_length", path)
    return where, _parse_entries(where, doc, _acceptance_entry(where))


def match_reference(where: str, entries: list, model: str, spec: RunSpec, protocol):
    """First entry of `model` whose protocol and spec keys all equal the run's; InputError listing the entries."""
    for entry in entries:
        if entry.model == model and entry.spec == spec and entry.protocol == protocol:
            return entry
    listed = "; ".join(f"[{e.spec.describe()}] ({e.protocol.describe()})" for e in entries if e.model == model)
    others = sorted({e.model for e in entries if e.model != model})
    rest = f"; other models: {', '.join(others)}" if others else ""
    raise InputError(f"{where}: no reference for {model} [{spec.describe()}] measured with {protocol.describe()}; "
                     f"{model} has: {listed or 'none'}{rest}. --no-reference runs it ungated")


def find_accuracy_reference(task: str, model: str, spec: RunSpec, protocol: ProtocolSpec,
                            path: Path | None = None) -> AccuracyReference:
    where, entries = load_accuracy_references(task, path)
    return match_reference(where, entries, model, spec, protocol)


def find_acceptance_reference(model: str, spec: RunSpec, protocol: AcceptanceProtocol,
                              path: Path | None = None) -> AcceptanceReference:
    where, entries = load_acceptance_references(path)
    return match_reference(where, entries, model, spec, protocol)
