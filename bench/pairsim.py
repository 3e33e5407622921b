"""Simulated attributions with known effects: what an A/B analysis's verdicts mean.

One simulated run is what ``pinwheel attribute`` measures: V variants (variant 0 the full
stack, variant k the stack without step k), R rounds, each round starting every variant
once in the design's order, S samples per start. A sample is

    y[v, r, s] = effect[v] + offset[v, r] + drift * t(v, r) + first * (position == 0)
                 + walk[r] + noise[v, r, s]

with ``t(v, r)`` the start's place in the whole run (r * V + position), ``offset`` one draw
per server start (what a start's placement, clocks and caches give it), ``walk`` a random
walk between rounds, ``noise`` normal or heavy-tailed (Student t, 3 degrees of freedom).
The comparisons are full vs without-k (``with - without`` = -effect[k]).

Vectorised over seeds with numpy (data), the analysis under test called once per seed:
``rates`` counts how often it reports an effect where there is none and how often its
interval holds the true effect. bench/attribute_calibration.py prints the table;
tests/test_attribute_calibration.py holds the analysis to its level.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# (with_starts, without_starts) per comparison -> (lo, hi, verdict) per comparison, where
# a start is the list of its samples and the two lists are aligned by round.
Starts = list[list[float]]
Analysis = Callable[[list[tuple[Starts, Starts]]], list[tuple[float, float, str]]]
Order = Callable[[int, int], list[list[int]]]  # (variants, rounds) -> order of each round


@dataclass(frozen=True)
class Scenario:
    name: str
    variants: int = 2
    rounds: int = 4
    samples: int = 4
    offset_sd: float = 0.0  # per-start offset, in units of the sample noise
    heavy: bool = False  # Student t(3) noise and offsets instead of normal
    drift: float = 0.0  # per start, in the run's order
    first: float = 0.0  # the first start of every round is this much slower
    walk_sd: float = 0.0  # random walk between rounds


def forward_reverse(variants: int, rounds: int) -> list[list[int]]:
    """The order before issue 50: every round in turn, odd rounds reversed."""
    base = list(range(variants))
    return [base if r % 2 == 0 else base[::-1] for r in range(rounds)]


def simulate(
    sc: Scenario, seeds: int, order: Order, effect: float, seed0: int = 0
) -> np.ndarray:
    """y[seed, variant, round, sample]; variant k>0 is ``effect`` lower than the full stack
    (so every comparison's true ``with - without`` is ``effect``)."""
    rng = np.random.default_rng(seed0)
    v, r, s = sc.variants, sc.rounds, sc.samples

    def draw(*shape: int) -> np.ndarray:
        return rng.standard_t(3, size=shape) if sc.heavy else rng.standard_normal(shape)

    rows = order(v, r)
    position = np.zeros((v, r))
    for ri, row in enumerate(rows):
        for pos, vi in enumerate(row):
            position[vi, ri] = pos
    t = np.arange(r)[None, :] * v + position  # each start's place in the run
    y = draw(seeds, v, r, s)
    y += sc.offset_sd * draw(seeds, v, r)[..., None]
    y += (sc.drift * t + sc.first * (position == 0))[None, :, :, None]
    y += np.cumsum(sc.walk_sd * rng.standard_normal((seeds, 1, r)), axis=2)[..., None]
    y[:, 1:] -= effect
    return np.asarray(y)


@dataclass(frozen=True)
class Rates:
    scenario: str
    pairs: int  # rounds x samples
    positive: float  # share of runs where comparison 1 reports an effect (no effect there)
    familywise: float | None  # any of the comparisons reports one (V > 2)
    coverage: float | None  # comparison 1's interval holds the true effect
    no_verdict: float  # share of runs without a verdict (design too small)


def rates(
    sc: Scenario, analysis: Analysis, order: Order, seeds: int, effect: float = 1.0
) -> Rates:
    """False-positive, familywise and coverage rates of ``analysis`` over ``seeds`` runs."""
    null = simulate(sc, seeds, order, 0.0, seed0=1)
    real = simulate(sc, seeds, order, effect, seed0=2)
    pos = fam = none = cov = 0
    for i in range(seeds):
        out = analysis(_comparisons(null[i]))
        said = [v not in _SILENT and not v.startswith("not enough") for *_, v in out]
        pos += said[0]
        fam += any(said)
        none += out[0][2].startswith("not enough")
        lo, hi, _ = analysis(_comparisons(real[i]))[0]
        cov += lo <= effect <= hi
    return Rates(
        sc.name,
        sc.rounds * sc.samples,
        pos / seeds,
        fam / seeds if sc.variants > 2 else None,
        cov / seeds,
        none / seeds,
    )


_SILENT = ("within noise",)


def _comparisons(y: np.ndarray) -> list[tuple[Starts, Starts]]:
    full = y[0].tolist()
    return [(full, y[k].tolist()) for k in range(1, y.shape[0])]


# --------------------------------------------------------------------------- before


def pooled_bootstrap(
    with_: Sequence[float], without: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, str]:
    """``pinwheel.serve.pairstats.paired`` as it was before issue 50 (commit 0e8a673,
    copied verbatim in what it computes): every sample of every start one independent pair,
    a percentile bootstrap of their mean, "within noise" when the interval holds 0."""
    diffs = [a - b for a, b in zip(with_, without, strict=True)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(
        math.fsum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)
    )

    def pct(q: float) -> float:
        k = (len(means) - 1) * q
        lo = math.floor(k)
        hi = min(lo + 1, len(means) - 1)
        return means[lo] + (means[hi] - means[lo]) * (k - lo)

    low, high = pct(0.025), pct(0.975)
    delta = math.fsum(diffs) / n
    if low <= 0.0 <= high:
        return low, high, "within noise"
    return low, high, "higher" if delta > 0 else "lower"


def before_verbatim(comparisons: list[tuple[Starts, Starts]]) -> list[tuple[float, float, str]]:
    """The analysis before issue 50: pairs (round, sample) pooled, no correction over steps
    (:func:`pooled_bootstrap`, pure Python: slow, the check of :func:`before`)."""
    out = []
    for a, b in comparisons:
        flat_a = [x for start in a for x in start]
        flat_b = [x for start in b for x in start]
        out.append(pooled_bootstrap(flat_a, flat_b))
    return out


def before(comparisons: list[tuple[Starts, Starts]]) -> list[tuple[float, float, str]]:
    """:func:`before_verbatim` in numpy: the same statistic (2000 resamples of the pooled
    pairs, numpy's linear percentiles as the old code's), another random stream."""
    out = []
    rng = np.random.default_rng(0)
    for a, b in comparisons:
        d = (np.asarray(a) - np.asarray(b)).ravel()
        means = d[rng.integers(0, len(d), size=(2000, len(d)))].mean(axis=1)
        lo, hi = np.quantile(means, [0.025, 0.975])
        verdict = "within noise" if lo <= 0 <= hi else ("higher" if d.mean() > 0 else "lower")
        out.append((float(lo), float(hi), verdict))
    return out


def cluster_bootstrap(comparisons: list[tuple[Starts, Starts]]) -> list[tuple[float, float, str]]:
    """The other candidate: a percentile bootstrap over rounds (each round's difference of
    per-start means one unit), no correction."""
    out = []
    for a, b in comparisons:
        d = np.array([np.mean(x) - np.mean(y) for x, y in zip(a, b, strict=True)])
        if len(d) < 2:
            out.append((float(d.mean()), float(d.mean()), "not enough starts"))
            continue
        rng = np.random.default_rng(0)
        means = d[rng.integers(0, len(d), size=(2000, len(d)))].mean(axis=1)
        lo, hi = np.quantile(means, [0.025, 0.975])
        verdict = "within noise" if lo <= 0 <= hi else ("higher" if d.mean() > 0 else "lower")
        out.append((float(lo), float(hi), verdict))
    return out


# --------------------------------------------------------------------------- after


def after(comparisons: list[tuple[Starts, Starts]]) -> list[tuple[float, float, str]]:
    """The analysis ``pinwheel attribute`` makes since issue 50: per comparison a t interval
    over rounds of per-start means, verdicts by Holm over the comparisons."""
    from pinwheel.serve import pairstats

    effects = pairstats.holm([pairstats.by_starts(a, b) for a, b in comparisons])
    out = []
    for e in effects:
        assert e is not None
        out.append((e.ci_low, e.ci_high, e.verdict))
    return out


def uncorrected(comparisons: list[tuple[Starts, Starts]]) -> list[tuple[float, float, str]]:
    """As :func:`after` without Holm: each comparison at its own level."""
    from pinwheel.serve import pairstats

    out = []
    for a, b in comparisons:
        e = pairstats.by_starts(a, b)
        assert e is not None
        out.append((e.ci_low, e.ci_high, e.verdict))
    return out


def balanced(variants: int, rounds: int) -> list[list[int]]:
    from pinwheel.serve import pairstats

    return pairstats.balanced_order(variants, rounds)


# The scenarios of issue 50's table and its brief. ``rounds`` is the design's: today's
# default was 3 rounds x 4 samples; the balanced order needs a multiple of the variants.
def scenarios(design: str) -> list[Scenario]:
    old = design == "before"
    r2 = 3 if old else 4  # two variants: today's default 3 rounds, ABBA x 2 after
    r5 = 3 if old else 5  # five variants (four steps): a whole Williams block after
    return [
        Scenario("no effect", rounds=r2),
        Scenario("per-start offset 1 sigma", rounds=r2, offset_sd=1.0),
        Scenario("per-start offset 1 sigma, 12 rounds", rounds=12, offset_sd=1.0),
        Scenario("1 pair", rounds=1, samples=1),
        Scenario("2 pairs", rounds=2, samples=1),
        Scenario("3 pairs", rounds=3, samples=1),
        Scenario("heavy tails (t3 noise and offsets)", rounds=r2, offset_sd=0.5, heavy=True),
        Scenario("drift between rounds (walk 1 sigma) + 0.1 sigma/start", rounds=r2,
                 drift=0.1, walk_sd=1.0),
        Scenario("order effect: drift 0.5 sigma/start", rounds=r2, drift=0.5),
        Scenario("4 steps, first start +1 sigma", variants=5, rounds=r5, first=1.0, offset_sd=0.5),
        Scenario(
            "4 steps, all of it", variants=5, rounds=r5, offset_sd=1.0, heavy=True, drift=0.3,
            first=1.0, walk_sd=1.0,
        ),  # fmt: skip
    ]
