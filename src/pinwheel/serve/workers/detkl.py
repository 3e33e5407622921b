"""Deterministic exact KLD per position: the same bits on every CPU (the canonical values).

Imports nothing but numpy and the standard library: the vLLM worker extension
(:mod:`kld_ext`, run inside the engine's own venv) and pinwheel (``qualify
verify-receipt``, tests) both use this one file.

Why not ``np.exp``: numpy dispatches its transcendental functions to SIMD code
chosen by the CPU (AVX-512, AVX2, baseline, NEON), and those paths may round the
same input differently by one ulp. Here only IEEE-754 basic operations are used
element-wise (``+ - * /``, exact ``rint`` and ``ldexp``; numpy never fuses a
multiply and an add across two ufunc calls), each correctly rounded and so the
same on every CPU; ``exp`` is a fixed Cody-Waite reduction and a fixed
polynomial evaluated in a fixed order; ``log`` (once per row) is a fixed series
in plain Python floats; sums are :func:`tree_sum` (one fixed pairwise order).
Probabilities and terms below 2**-900 are set to 0 explicitly, so no subnormal
number arises and a flush-to-zero mode set by some library cannot change a bit.

Per position: ``KL = sum_v p_t(v) (lt(v) - ls(v))`` over the teacher's support,
with ``lt = t - LSE(t)``, ``ls = s - LSE(s)`` (both rows renormalized in
float64), ``p_t = exp(t - max t) / sum exp(t - max t)``; ``+inf`` where the
student has no mass and the teacher has; clamped at 0. Top-1: the highest value,
ties to the lowest token id.

Canonical serialization: the float64 values little-endian (``<f8``), one per
position: ``sha256`` of those bytes is ``kld_f64_sha256``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

METHOD = "pinwheel.detkl/1"  # named in receipts: which deterministic method made the values
RECORD = np.dtype([("kl", "<f8"), ("flags", "u1"), ("top1", "<i4")])  # 13 bytes a position
AGREE, TIED = 1, 2  # flags: both top-1 agree; either side's maximum was tied

_N = 64  # table steps per octave: exp(x) = 2**(m + j/64) * exp(r), |r| <= ln2/128
_INV_LN2_N = 92.33248261689366  # 64 / ln 2
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's ln2 split: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_STEP_HI = _LN2_HI / _N  # exact (a power of two)
_STEP_LO = _LN2_LO / _N
_EXP_MIN = -708.0  # below: 0 (results stay normal numbers, no subnormal path)
_TINY = 2.0**-900  # a probability or term below: 0 (sums stay clear of subnormals)
_EXP_COEF = (1 / 120, 1 / 24, 1 / 6, 0.5, 1.0, 1.0)  # Horner, degree 5: error < 4e-17


def _table() -> Any:
    """2**(j/64), j = 0..63, correctly rounded: computed in decimal (integer arithmetic,
    the same on every machine), not by the platform's libm."""
    import decimal

    ctx = decimal.Context(prec=60)
    ln2 = ctx.ln(decimal.Decimal(2))
    return np.array([float(ctx.exp(ln2 * j / _N)) for j in range(_N)], np.float64)


_TABLE = _table()


class Buffers:
    """Work arrays of one row's width, reused: numpy allocating a fresh array for every
    operation costs more than the arithmetic (page faults on each new buffer)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.k = np.empty(width)
        self.r = np.empty(width)
        self.p = np.empty(width)
        self.w = np.empty(width)
        self.ki = np.empty(width, np.int64)
        self.j = np.empty(width, np.int64)
        self.low = np.empty(width, bool)
        self.tree = np.empty(1 << max(0, (width - 1).bit_length()))


def pexp_into(x: Any, out: Any, buf: Buffers) -> Any:
    """``out = exp(x)`` for a float64 row of ``buf.width``, basic operations only (error
    about 1.5 ulp), the same bits on every CPU; -inf and x < -708 give 0."""
    low, k, r, p, ki, j = buf.low, buf.k, buf.r, buf.p, buf.ki, buf.j
    np.less(x, _EXP_MIN, out=low)
    np.copyto(r, x)
    np.copyto(r, 0.0, where=low)  # also -inf
    np.multiply(r, _INV_LN2_N, out=k)
    np.rint(k, out=k)
    np.multiply(k, _STEP_HI, out=p)
    np.subtract(r, p, out=r)
    np.multiply(k, _STEP_LO, out=p)
    np.subtract(r, p, out=r)
    ki[:] = k  # exact: |k| < 2**17
    np.bitwise_and(ki, _N - 1, out=j)
    np.right_shift(ki, 6, out=ki)  # floor division by 64
    p.fill(_EXP_COEF[0])
    for c in _EXP_COEF[1:]:
        np.multiply(p, r, out=p)
        np.add(p, c, out=p)
    np.take(_TABLE, j, out=r)
    np.multiply(p, r, out=p)
    np.ldexp(p, ki, out=out)
    np.copyto(out, 0.0, where=low)
    return out


def pexp(x: Any) -> Any:
    """exp of a float64 array (any shape), as :func:`pexp_into`."""
    x = np.asarray(x, np.float64)
    flat = x.reshape(-1)
    out = np.empty(flat.shape)
    if len(flat):
        pexp_into(flat, out, Buffers(len(flat)))
    return out.reshape(x.shape)


def plog(s: float) -> float:
    """log of one positive finite float with plain float operations (same bits everywhere)."""
    if not (s > 0.0 and math.isfinite(s)):
        raise ValueError(f"plog of {s!r}")
    m, e = math.frexp(s)  # s = m * 2**e, m in [0.5, 1)
    if m < 0.7071067811865476:
        m, e = m * 2.0, e - 1
    f = (m - 1.0) / (m + 1.0)  # |f| <= 0.1716
    f2 = f * f
    acc = 0.0
    for n in range(29, 0, -2):  # 2 (f + f^3/3 + ... + f^29/29)
        acc = acc * f2 + 1.0 / n
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * f * acc)


def tree_sum(a: Any, buf: Buffers | None = None) -> float:
    """Sum of a float64 row in one fixed order (zero-padded to a power of two, then the
    halves added element-wise): the same bits on every CPU, error <= log2(n) ulps."""
    a = np.asarray(a, np.float64).reshape(-1)
    size = 1 << max(0, (len(a) - 1).bit_length())
    t = buf.tree if buf is not None and len(buf.tree) == size else np.empty(size)
    t[: len(a)] = a
    t[len(a) :] = 0.0
    while size > 1:
        size //= 2
        np.add(t[:size], t[size : 2 * size], out=t[:size])
    return float(t[0])


class Scorer:
    """Scores pairs of full rows of one width, reusing its work arrays."""

    def __init__(self, width: int) -> None:
        self.buf = Buffers(width)
        self.t = np.empty(width)
        self.s = np.empty(width)
        self.et = np.empty(width)
        self.es = np.empty(width)
        self.d = np.empty(width)
        self.mask = np.empty(width, bool)

    def _lse(self, row: Any, out: Any) -> tuple[float, float, float]:
        """(max, LSE, sum) of the row; ``out`` gets exp(row - max)."""
        m = float(row.max())
        if m != m or m == math.inf:  # max propagates NaN
            raise ValueError("a row holds NaN or +inf log-probabilities")
        if m == -math.inf:
            raise ValueError("a row with no mass (every log-probability is -inf)")
        np.subtract(row, m, out=self.d)
        pexp_into(self.d, out, self.buf)
        total = tree_sum(out, self.buf)
        return m, m + plog(total), total

    def _flush(self, a: Any) -> None:
        np.abs(a, out=self.buf.w)
        np.less(self.buf.w, _TINY, out=self.mask)
        np.copyto(a, 0.0, where=self.mask)

    # -inf - -inf off the support, and x - max overflowing to -inf (1e308 - -1e308): both
    # only where p_t is 0, masked to 0 below
    @np.errstate(invalid="ignore", over="ignore")
    def one(self, teacher: Any, student: Any) -> tuple[float, int, int, bool]:
        """(KL, flags, student top-1, tied) of one pair of rows (any float dtype)."""
        t, s = self.t, self.s
        np.copyto(t, teacher)
        np.copyto(s, student)
        mt, lt, st = self._lse(t, self.et)
        ms, ls, _ = self._lse(s, self.es)
        p, d = self.et, self.d
        np.divide(p, st, out=p)  # p_t = exp(t - max) / sum: 0 off the teacher's support
        self._flush(p)
        t_holes = float(t.min()) == -math.inf
        if float(s.min()) == -math.inf and bool(((s == -math.inf) & (t > -math.inf)).any()):
            kl = math.inf  # the student has no mass where the teacher has
        else:
            np.subtract(t, lt, out=d)  # tn
            np.subtract(s, ls, out=self.es)  # sn
            np.subtract(d, self.es, out=d)
            if t_holes:  # off the teacher's support: 0 * log 0 = 0
                np.equal(t, -math.inf, out=self.mask)
                np.copyto(d, 0.0, where=self.mask)
            # p_t = 0 (below 2**-900, or exp underflowed): no term. Where t - LSE(t)
            # overflowed to -inf (rows spanning more than the float range), 0 * -inf
            # would be NaN; the term is 0 (p_t log p_t -> 0).
            np.equal(p, 0.0, out=self.mask)
            np.copyto(d, 0.0, where=self.mask)
            np.multiply(p, d, out=d)
            self._flush(d)
            total = tree_sum(d, self.buf)
            if total != total:  # never max(0.0, nan) = 0.0: a NaN is an error, not a value
                raise ValueError("the KLD sum is NaN (the rows are not distributions)")
            kl = max(0.0, total) + 0.0
        t_top, t_tie = _top1(t, mt)
        s_top, s_tie = _top1(s, ms)
        flags = (AGREE if t_top == s_top else 0) | (TIED if t_tie or s_tie else 0)
        return kl, flags, s_top, t_tie or s_tie


def _top1(row: Any, best: float) -> tuple[int, bool]:
    """The highest value's index (the first: ties to the lowest token id), and a tie."""
    top = int(row.argmax())
    return top, bool(np.count_nonzero(row == best) > 1)


def batch(teacher: Any, student: Any) -> Any:
    """A RECORD per row of two [n, V] arrays of log-probabilities (or logits: both rows
    are renormalized here in float64)."""
    t = np.asarray(teacher)
    s = np.asarray(student)
    if t.ndim != 2 or t.shape != s.shape:
        raise ValueError(f"teacher rows {t.shape} and student rows {s.shape} differ")
    out = np.zeros(len(t), RECORD)
    sc = Scorer(t.shape[1])
    for i in range(len(t)):
        kl, flags, top, _ = sc.one(t[i], s[i])
        out[i] = (kl, flags, top)
    return out


def position(teacher: Any, student: Any) -> tuple[float, bool, int, bool]:
    """(KL, top-1 agree, student top-1, tied) of one pair of full rows."""
    r = batch(np.asarray(teacher)[None, :], np.asarray(student)[None, :])[0]
    return float(r["kl"]), bool(r["flags"] & AGREE), int(r["top1"]), bool(r["flags"] & TIED)


def canonical_bytes(kl: Any) -> bytes:
    """The per-position values as float64 little-endian: what ``kld_f64_sha256`` hashes."""
    a = np.asarray(kl, np.float64)
    if np.isnan(a).any():
        raise ValueError("a per-position KLD is NaN")
    out: bytes = (a + 0.0).astype("<f8").tobytes()  # + 0.0: -0.0 -> 0.0
    return out


def f64_sha256(kl: Any) -> str:
    return hashlib.sha256(canonical_bytes(kl)).hexdigest()
