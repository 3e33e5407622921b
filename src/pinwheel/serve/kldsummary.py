"""The fidelity summary figures, defined so that anyone recomputes them bit for bit.

In: the per-position KLD values (float64, >= 0, ``+inf`` allowed, never NaN), the
per-position flags (bit 1: top-1 agreement, bit 2: a tied maximum), the positions
per window, the bootstrap's resamples and seed. Out: :class:`Figures` (mean, 95% CI,
median, p99, max, top-1, ties). Pure Python (no numpy): ``qualify verify-receipt``
runs from the plain install; the writer (:mod:`pinwheel.serve.fidelity`) gives the
same bits with numpy for large panels (tests/test_kldsummary.py compares them).

Definitions (``METHOD``; docs/qualify.md states them for independent verifiers):

- sum: :func:`math.fsum` (the exactly rounded sum, any order); a sum that overflows
  is ``+inf``. mean = sum / n (one IEEE division).
- quantile ``q = num/den`` of sorted values ``s``: ``(n-1) num = i den + r``
  (integers); ``s[i]`` when ``r == 0`` or ``s[i] == s[i+1]``, else
  ``s[i] + (s[i+1] - s[i]) * (r / den)`` (numpy's "linear" rule, its rounding fixed).
  median: q = 1/2; p99: q = 99/100.
- top-1: (positions with bit 1) / n; ties: positions with bit 2.
- CI: units are the windows (the positions when there is one window); a unit's sum
  is the fsum of its values, its count its positions. Draw ``k = 0, 1, ...``:
  ``splitmix64(seed + (k + 1) * 0x9E3779B97F4A7C15 mod 2**64) mod units``; resample
  ``r`` takes draws ``r*units .. r*units + units - 1``; its mean is the left-to-right
  float64 sum of the drawn units' sums divided by the sum of their counts. The CI is
  the quantiles 25/1000 and 975/1000 of the sorted resample means.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

METHOD = "pinwheel.kldsummary/1"
AGREE, TIED = 1, 2  # the flags bits (as pinwheel.serve.workers.detkl)
MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


@dataclass(frozen=True)
class Figures:
    mean: float
    ci95: tuple[float, float]
    median: float
    p99: float
    max: float
    top1: float
    ties: int


def total(values: Sequence[float]) -> float:
    """The exactly rounded sum of non-negative values; +inf when it overflows."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def mean(values: Sequence[float]) -> float:
    return total(values) / len(values)


def percentile(ordered: Sequence[float], num: int, den: int) -> float:
    """The ``num/den`` quantile of sorted values, linear between the two nearest ranks:
    ``(n-1) num / den = i + r/den`` in integers; ``s[i]`` when ``r`` is 0 or
    ``s[i] == s[i+1]``, else ``s[i] + (s[i+1] - s[i]) * (r / den)``."""
    i, r = divmod((len(ordered) - 1) * num, den)
    a = ordered[i]
    if r == 0 or a == ordered[i + 1]:
        return a
    return a + (ordered[i + 1] - a) * (r / den)


def median(ordered: Sequence[float]) -> float:
    return percentile(ordered, 1, 2)


def p99(ordered: Sequence[float]) -> float:
    return percentile(ordered, 99, 100)


def rank_ci(ordered_means: Sequence[float]) -> tuple[float, float]:
    return percentile(ordered_means, 25, 1000), percentile(ordered_means, 975, 1000)


def splitmix64(x: int) -> int:
    z = x & MASK
    z = ((z ^ (z >> 30)) * MIX1) & MASK
    z = ((z ^ (z >> 27)) * MIX2) & MASK
    return z ^ (z >> 31)


def draws(seed: int, start: int, count: int, units: int) -> Iterator[int]:
    """Unit indices ``start .. start + count - 1`` of the seeded stream."""
    base = seed & MASK
    for k in range(start, start + count):
        yield splitmix64(base + (k + 1) * GOLDEN) % units


def units_of(values: Sequence[float], lengths: Sequence[int]) -> tuple[list[float], list[int]]:
    """(sum, count) per bootstrap unit: the windows, or the positions of a single window."""
    if len(lengths) >= 2:
        sums, at = [], 0
        for n in lengths:
            sums.append(total(values[at : at + n]))
            at += n
        return sums, list(lengths)
    return list(values), [1] * len(values)


def bootstrap_means(
    sums: Sequence[float], counts: Sequence[int], resamples: int, seed: int
) -> list[float]:
    units = len(sums)
    means = []
    for r in range(resamples):
        s, c = 0.0, 0
        for i in draws(seed, r * units, units, units):
            s += sums[i]
            c += counts[i]
        means.append(s / c)
    return means


def figures(
    values: Sequence[float],
    flags: Sequence[int],
    lengths: Sequence[int],
    resamples: int,
    seed: int,
    ci: tuple[float, float] | None = None,
) -> Figures:
    """Every summary figure from the per-position values and flags (pure Python; ``ci``:
    the bootstrap's interval when the caller computed it already, with numpy)."""
    ordered = sorted(values)
    if ci is None:
        sums, counts = units_of(values, lengths)
        ci = rank_ci(sorted(bootstrap_means(sums, counts, resamples, seed)))
    return Figures(
        mean=mean(values),
        ci95=ci,
        median=median(ordered),
        p99=p99(ordered),
        max=ordered[-1],
        top1=sum(1 for f in flags if f & AGREE) / len(flags),
        ties=sum(1 for f in flags if f & TIED),
    )
