"""TensorRT-LLM's one-sided hypothesis test: is a score on n samples a regression from a reference?

    scale     = sqrt(2 sigma^2 / n)
    threshold = ref + Phi^-1(alpha) * scale           (pass when score >= threshold)
    theta     = -(Phi^-1(alpha) + Phi^-1(beta)) * scale   (smallest regression detected with power 1-beta)

A golden of a deterministic smoke run may also carry a `ceiling`: a score above it means the run no longer
measures what the golden did (a changed prompt, a leaked answer), which fails the gate too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from statistics import NormalDist

DEFAULT_ALPHA = 0.05
DEFAULT_BETA = 0.2
DEFAULT_SIGMA = 50.0  # worst-case Bernoulli on the 0-100 scale


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"  # below threshold: exit code 1
    NO_REFERENCE = "no_reference"  # --no-reference: measured, not gated


@dataclass(frozen=True)
class Gate:
    reference: float
    n: int
    threshold: float
    theta: float
    sigma: float
    alpha: float
    beta: float
    ceiling: float | None = None  # goldens of deterministic runs: fail above it too

    @property
    def can_fail(self) -> bool:
        """Whether some score on 0-100 fails: at a few items the threshold may fall below 0 (n=1 against a reference
        of 80: -35.8), and then no run of that size can fail the gate."""
        return self.threshold > 0.0 or (self.ceiling is not None and self.ceiling < 100.0)

    def verdict(self, score: float) -> Verdict:
        above = self.ceiling is not None and score > self.ceiling
        return Verdict.PASS if score >= self.threshold and not above else Verdict.FAIL


def sigma_from_reference(reference: float) -> float:
    """Bernoulli sigma of the reference accuracy itself: 100 sqrt(p (1 - p))."""
    p = reference / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p))


def make_gate(
    reference: float,
    n: int,
    sigma: float = DEFAULT_SIGMA,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    floor: float | None = None,
    ceiling: float | None = None,
) -> Gate:
    """The gate for n samples; an explicit `floor` (the reference entry's `threshold`) replaces the computed one;
    `ceiling` (a golden's) fails scores above it."""
    if n <= 0:
        raise ValueError("a gate needs at least one sample")
    z = NormalDist()
    scale = math.sqrt(2.0 * sigma**2 / n)
    threshold = reference + z.inv_cdf(alpha) * scale
    theta = -(z.inv_cdf(alpha) + z.inv_cdf(beta)) * scale
    if floor is not None:
        threshold = floor
    return Gate(reference, n, threshold, theta, sigma, alpha, beta, ceiling)
