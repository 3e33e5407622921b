"""A/B statistics over server starts: the order a run starts its variants in, each step's
effect with a t interval over starts, Holm's correction over several steps, and the
smallest effect the design could have detected.

**The unit is the start.** Samples taken in one server start (or one process of a kernel
bench) share that start's placement, clocks and caches: they are not independent pairs
(treating them so reported an effect in 27% of simulated runs without one, with a
per-start offset of one noise sigma). Each start gives one number, the mean of its
samples; a round starts every variant once, so a step's *round difference* is the full
start's mean minus the without-start's mean of the same round, and the effect is the
mean of the round differences with a Student t interval over rounds (``n - 1`` degrees
of freedom). bench/attribute_calibration.py measures what this and the alternatives
mean on simulated runs with known effects; tests/test_attribute_calibration.py holds it
to its level.

**Order** (:func:`balanced_order`): round ``r`` is row ``r`` of a Williams design: over
every ``len(variants)`` rounds each variant takes every place in the order once, so any
effect of the place (the first start of a round warms a cache, the box drifts through
the run) falls on every variant alike and cancels from every difference; for an even
number of variants the same rounds also give every variant every predecessor once, and
for an odd number the next block of rounds (the rows reversed) does. With two variants
this is AB, BA: ABBA.

**Too small is said**: fewer than :data:`MIN_ROUNDS` round differences (no spread to
judge by) give no verdict but "not enough starts: N needed for a verdict"; the caller
can ask for more (a balanced order needs a whole block of rounds).

**Several steps** (:func:`holm`): the verdicts of m steps on one metric are decided by
Holm's step-down p-values (family-wise level ``1 - confidence``); each interval is the
step's own (``confidence``), and each step carries the smallest effect its design would
detect 80% of the time at the strictest Holm threshold (``alpha / m``), from the spread
its round differences showed: ``(t(1 - alpha/2m) + t(0.8)) * sd / sqrt(n)``.

Pure Python (:func:`math.lgamma`, a continued fraction for the incomplete beta): the same
inputs give the same figures on any machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from pinwheel.errors import UsageError

NOISE = "within noise"
NOT_ENOUGH = "not enough starts"
MIN_ROUNDS = 2  # round differences needed for any spread, hence any verdict
POWER = 0.8  # the power the minimum detectable effect is stated at
METHOD = "t interval over per-start means (one difference per round), Holm over steps"


@dataclass(frozen=True)
class Effect:
    n: int  # round differences (starts per variant that were paired)
    samples: int  # measurements behind them, per side
    mean_with: float  # mean of the per-start means
    mean_without: float
    delta: float  # mean of the round differences (with - without)
    sd: float  # their standard deviation (n - 1 in the denominator)
    ci_low: float
    ci_high: float
    confidence: float
    p: float  # two-sided p of the t test on its own
    verdict: str  # "higher" | "lower" | NOISE | "not enough starts: N needed ..."
    p_holm: float | None = None  # after Holm over the family (None: not in one)
    family: int = 1  # steps corrected together
    mde: float | None = None  # smallest |delta| detected with POWER at alpha / family

    @property
    def relative(self) -> float | None:
        """delta / mean_without (None when the baseline is 0)."""
        return self.delta / self.mean_without if self.mean_without else None

    @property
    def decided(self) -> bool:
        return not self.verdict.startswith(NOT_ENOUGH)

    def to_json(self) -> dict[str, object]:
        return {
            "n": self.n,
            "samples": self.samples,
            "with": self.mean_with,
            "without": self.mean_without,
            "delta": self.delta,
            "relative": self.relative,
            "sd": self.sd,
            "ci": [self.ci_low, self.ci_high] if self.decided else None,
            "confidence": self.confidence,
            "p": self.p,
            "p_holm": self.p_holm,
            "family": self.family,
            "mde": self.mde,
            "power": POWER,
            "method": METHOD,
            "verdict": self.verdict,
        }


# --------------------------------------------------------------------------- order


def balanced_order(variants: int, rounds: int) -> list[list[int]]:
    """Per round, the indices of ``variants`` in the order to start them (Williams rows;
    odd counts continue with the rows reversed)."""
    if variants < 1:
        return [[] for _ in range(rounds)]
    first, lo, hi = [0], 1, variants - 1
    while len(first) < variants:
        first.append(lo)
        lo += 1
        if len(first) < variants:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % variants for x in first] for r in range(variants)]
    if variants % 2:
        rows += [row[::-1] for row in rows]
    return [rows[r % len(rows)] for r in range(rounds)]


def block(variants: int) -> int:
    """Rounds after which every variant has started in every place equally often."""
    return max(variants, 1)


def rounds_needed(variants: int) -> int:
    """The fewest rounds that are balanced and give a verdict."""
    b = block(variants)
    return b * math.ceil(MIN_ROUNDS / b)


def check_rounds(rounds: int, variants: int) -> None:
    """Refuse a number of rounds that leaves the order unbalanced (fewer than one block is
    allowed: it is run, and its report says it is too small for a verdict)."""
    b = block(variants)
    if rounds > b and rounds % b:
        lower, upper = b * (rounds // b), b * (rounds // b + 1)
        raise UsageError(
            f"--rounds {rounds} does not balance the order of {variants} variants: every "
            f"{b} rounds each starts once in every place",
            where="--rounds",
            next=f"pass --rounds {lower} or --rounds {upper}",
        )


# --------------------------------------------------------------------------- one step


def check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence < 1.0:
        raise UsageError(
            f"confidence {confidence} is not in [0.5, 1)",
            where="--confidence",
            next="pass e.g. --confidence 0.95",
        )


def by_starts(
    with_: Sequence[Sequence[float]],
    without: Sequence[Sequence[float]],
    *,
    confidence: float = 0.95,
    min_effect: float = 0.0,
    needed: int = MIN_ROUNDS,
) -> Effect | None:
    """The effect of ``with_`` over ``without``, each a list of starts (the samples of one
    start) aligned by round; a round where either start has no sample is left out. None
    without a single round. ``needed``: rounds the caller's design needs for a verdict
    (at least :data:`MIN_ROUNDS`); ``min_effect``: a smaller |delta| is within noise."""
    if len(with_) != len(without):
        raise ValueError(f"unpaired starts: {len(with_)} with, {len(without)} without")
    check_confidence(confidence)
    pairs = [(list(a), list(b)) for a, b in zip(with_, without, strict=True) if a and b]
    if any(not math.isfinite(x) for a, b in pairs for x in (*a, *b)):
        raise ValueError("a measurement is not a finite number")
    if not pairs:
        return None
    ma = [math.fsum(a) / len(a) for a, _ in pairs]
    mb = [math.fsum(b) / len(b) for _, b in pairs]
    d = [x - y for x, y in zip(ma, mb, strict=True)]
    n = len(d)
    delta = math.fsum(d) / n
    sd = math.sqrt(math.fsum((x - delta) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    needed = max(needed, MIN_ROUNDS)
    effect = Effect(
        n=n,
        samples=min(sum(len(a) for a, _ in pairs), sum(len(b) for _, b in pairs)),
        mean_with=math.fsum(ma) / n,
        mean_without=math.fsum(mb) / n,
        delta=delta,
        sd=sd,
        ci_low=-math.inf,
        ci_high=math.inf,
        confidence=confidence,
        p=1.0,
        verdict=f"{NOT_ENOUGH}: {needed} needed for a verdict ({n} paired)",
    )
    if n < needed:
        return effect
    se = sd / math.sqrt(n)
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * se
    p = _p_two_sided(delta, se, n - 1)
    effect = dataclasses.replace(
        effect, ci_low=delta - half, ci_high=delta + half, p=p, verdict=NOISE
    )
    return _decide(effect, p, 1, min_effect)


def holm(effects: Sequence[Effect | None], *, min_effect: float = 0.0) -> list[Effect | None]:
    """The same effects with Holm's adjusted p-values over the decided ones, verdicts by
    them at ``1 - confidence`` family-wise, and each one's minimum detectable effect."""
    decided = sorted(
        (i for i, e in enumerate(effects) if e is not None and e.decided),
        key=lambda i: effects[i].p,  # type: ignore[union-attr]
    )
    m = len(decided)
    out = list(effects)
    running = 0.0
    for rank, i in enumerate(decided):
        e = effects[i]
        assert e is not None
        running = max(running, min(1.0, (m - rank) * e.p))
        out[i] = _decide(e, running, m, min_effect)
    return out


def _decide(e: Effect, p_adj: float, family: int, min_effect: float) -> Effect:
    alpha = 1 - e.confidence
    if p_adj <= alpha and abs(e.delta) >= min_effect and e.delta != 0:
        verdict = "higher" if e.delta > 0 else "lower"
    else:
        verdict = NOISE
    mde = mde_of(e.sd, e.n, alpha / family)
    return dataclasses.replace(e, p_holm=p_adj, family=family, mde=mde, verdict=verdict)


def mde_of(sd: float, n: int, alpha: float, power: float = POWER) -> float | None:
    """Smallest |effect| a two-sided t test over ``n`` round differences of spread ``sd``
    detects with ``power`` at level ``alpha`` (the usual normal-shift approximation)."""
    if n < MIN_ROUNDS:
        return None
    df = n - 1
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * sd / math.sqrt(n)


def _p_two_sided(delta: float, se: float, df: int) -> float:
    if se == 0.0:
        return 0.0 if delta != 0 else 1.0
    t = abs(delta) / se
    return _betainc(df / 2, 0.5, df / (df + t * t))


# --------------------------------------------------------------------------- Student t


@lru_cache(maxsize=4096)
def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (q in (0, 1))."""
    if not 0.0 < q < 1.0 or df < 1:
        raise ValueError(f"t quantile of {q} with {df} degrees of freedom")
    if q < 0.5:
        return -t_quantile(1 - q, df)
    if q == 0.5:
        return 0.0
    tail = 2 * (1 - q)  # two-sided tail beyond the answer
    lo, hi = 0.0, 1.0
    while _betainc(df / 2, 0.5, df / (df + hi * hi)) > tail:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _betainc(df / 2, 0.5, df / (df + mid * mid)) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


def t_cdf(t: float, df: int) -> float:
    tail = _betainc(df / 2, 0.5, df / (df + t * t)) / 2
    return 1 - tail if t > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h
