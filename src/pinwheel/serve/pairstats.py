"""Paired differences with a seeded bootstrap confidence interval, for A/B measurements.

In: two equally long lists of measurements taken in pairs (the same round of an
interleaved A B A B run, the same prompt), the number of resamples, a seed and the
confidence level. Out: an :class:`Effect`: the mean of the paired differences
(``with - without``), its percentile bootstrap interval and whether it is told apart
from zero. An interval that contains 0, or an effect smaller than the resolution the
caller states (``min_effect``, 0 by default), is "within noise".

Pure Python (:class:`random.Random`, :func:`math.fsum`): the same inputs and seed give
the same interval on any machine, whatever numpy or CPU it has.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pinwheel.errors import UsageError

NOISE = "within noise"
MAX_DRAWS = 20_000_000  # resamples x pairs: a bound on the work one interval may take


@dataclass(frozen=True)
class Effect:
    n: int  # pairs
    mean_with: float
    mean_without: float
    delta: float  # mean of (with - without)
    ci_low: float
    ci_high: float
    confidence: float
    resamples: int
    seed: int
    verdict: str  # "higher" | "lower" | NOISE

    @property
    def relative(self) -> float | None:
        """delta / mean_without (None when the baseline is 0)."""
        return self.delta / self.mean_without if self.mean_without else None

    def to_json(self) -> dict[str, object]:
        return {
            "n": self.n,
            "with": self.mean_with,
            "without": self.mean_without,
            "delta": self.delta,
            "relative": self.relative,
            "ci": [self.ci_low, self.ci_high],
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
            "verdict": self.verdict,
        }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), ``q`` in [0, 1]."""
    k = (len(sorted_values) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def paired(
    with_: Sequence[float],
    without: Sequence[float],
    *,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    min_effect: float = 0.0,
) -> Effect | None:
    """The paired effect of ``with_`` over ``without``; None without a single pair."""
    if len(with_) != len(without):
        raise ValueError(f"unpaired samples: {len(with_)} with, {len(without)} without")
    if not 0.5 <= confidence < 1.0:
        raise UsageError(
            f"confidence {confidence} is not in [0.5, 1)",
            where="--confidence",
            next="pass e.g. --confidence 0.95",
        )
    if resamples < 1 or resamples * max(len(with_), 1) > MAX_DRAWS:
        raise UsageError(
            f"{resamples} resamples x {len(with_)} pairs is outside 1..{MAX_DRAWS} draws",
            where="--resamples",
            next=f"pass --resamples at most {MAX_DRAWS // max(len(with_), 1)}",
        )
    pairs = [(a, b) for a, b in zip(with_, without, strict=True)]
    if any(not (math.isfinite(a) and math.isfinite(b)) for a, b in pairs):
        raise ValueError("a measurement is not a finite number")
    if not pairs:
        return None
    diffs = [a - b for a, b in pairs]
    n = len(diffs)
    delta = math.fsum(diffs) / n
    rng = random.Random(seed)
    means = sorted(
        math.fsum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)
    )
    tail = (1.0 - confidence) / 2
    low, high = percentile(means, tail), percentile(means, 1.0 - tail)
    if low <= 0.0 <= high or abs(delta) < min_effect:
        verdict = NOISE
    else:
        verdict = "higher" if delta > 0 else "lower"
    return Effect(
        n=n,
        mean_with=math.fsum(a for a, _ in pairs) / n,
        mean_without=math.fsum(b for _, b in pairs) / n,
        delta=delta,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        verdict=verdict,
    )
