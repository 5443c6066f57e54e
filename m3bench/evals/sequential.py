"""Sequential testing (`m3bench accuracy --sequential`): Wald's SPRT over item batches.

    sprt = Sprt.for_gate(gate)                    # H0: p = ref, H1: p = ref - theta (the gate's theta)
    sprt.decide(successes=412.0, n=450)           # Verdict.PASS / Verdict.FAIL, or None: keep going

After every batch of items the log-likelihood ratio of H1 against H0,
    LLR = S log(p1 / p0) + (n - S) log((1 - p1) / (1 - p0)),   S = sum of item values (0..1),
is compared with Wald's bounds log(beta / (1 - alpha)) (accept H0: pass) and log((1 - beta) / alpha)
(reject H0: a regression, fail). A run that reaches its last item without crossing either bound takes
the fixed-sample gate's verdict on all items. Items are taken in a seeded shuffle so that a prefix is a
random sample (MMLU's file order is by subject). For GSM8K's half-credit items the same formula is
the Bernoulli quasi-likelihood. `simulate` runs the same rule on many synthetic runs at once (numpy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from m3bench.evals.gate import Gate, Verdict
from m3bench.runtime.errors import InputError

DEFAULT_BATCH = 50


@dataclass(frozen=True)
class Sprt:
    p0: float  # the reference accuracy, 0..1
    p1: float  # the reference minus the gate's minimum detectable regression theta, 0..1
    alpha: float
    beta: float

    @classmethod
    def for_gate(cls, gate: Gate) -> "Sprt":
        p0, p1 = gate.reference / 100.0, (gate.reference - gate.theta) / 100.0
        if not 0.0 < p1 < p0 < 1.0:
            raise InputError(f"--sequential needs 0 < reference - theta < reference < 100, got reference "
                             f"{gate.reference:.2f}, theta {gate.theta:.2f}")
        return cls(p0, p1, gate.alpha, gate.beta)

    @property
    def lower(self) -> float:
        return math.log(self.beta / (1.0 - self.alpha))

    @property
    def upper(self) -> float:
        return math.log((1.0 - self.beta) / self.alpha)

    def llr(self, successes, n):
        """log L(p1) / L(p0) of `successes` in n items (floats or numpy arrays)."""
        return successes * math.log(self.p1 / self.p0) + (n - successes) * math.log((1 - self.p1) / (1 - self.p0))

    def decide(self, successes: float, n: int) -> Verdict | None:
        value = self.llr(successes, n)
        if value >= self.upper:
            return Verdict.FAIL
        if value <= self.lower:
            return Verdict.PASS
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"p0": self.p0, "p1": self.p1, "alpha": self.alpha, "beta": self.beta,
                "lower": self.lower, "upper": self.upper}


def boundaries(n_max: int, batch: int) -> list[int]:
    """Item counts after which the test looks: every `batch` items, and the last item."""
    if batch < 1:
        raise InputError(f"--sequential-batch must be >= 1, got {batch}")
    return sorted({*range(batch, n_max, batch), n_max})


def simulate(sprt: Sprt, gate: Gate, n_max: int, batch: int, p_true: float, runs: int, seed: int = 0):
    """(fail rate, mean stopping n) of `runs` synthetic Bernoulli(p_true) runs under the sequential rule."""
    import numpy as np

    rng = np.random.default_rng(seed)
    looks = np.array(boundaries(n_max, batch))
    items = rng.random((runs, n_max), dtype=np.float32) < p_true
    successes = np.cumsum(items, axis=1, dtype=np.int32)[:, looks - 1]
    llr = sprt.llr(successes.astype(np.float64), looks[None, :].astype(np.float64))
    crossed = (llr >= sprt.upper) | (llr <= sprt.lower)
    stop = np.where(crossed.any(axis=1), crossed.argmax(axis=1), len(looks) - 1)
    at = llr[np.arange(runs), stop]
    fixed_fail = 100.0 * successes[:, -1] / n_max < gate.threshold  # no crossing: the fixed-sample gate
    fail = np.where(crossed[np.arange(runs), stop], at >= sprt.upper, fixed_fail)
    return float(fail.mean()), float(looks[stop].mean())
