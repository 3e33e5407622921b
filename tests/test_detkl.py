"""The canonical per-position KLD (serve/workers/detkl.py): exact, and the same bits on any CPU.

Checked against an independent implementation (math.exp / math.fsum per element, and
pinwheel.serve.kld.exact_kl), on adversarial rows (-inf holes, ties, a student with no
mass where the teacher has some, huge and tiny logits), and run under several numpy CPU
feature sets in subprocesses: the bytes of the values must not change (np.exp may).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pinwheel.serve import fidelity
from pinwheel.serve import kld as kld_math
from pinwheel.serve.workers import detkl

SRC = Path(__file__).resolve().parent.parent / "src"


def _slow_kl(t: np.ndarray, s: np.ndarray) -> float:
    """Float64 KL with math.exp / math.log / math.fsum per element (no numpy transcendentals)."""
    t = t.astype(np.float64).tolist()
    s = s.astype(np.float64).tolist()

    def lse(row: list[float]) -> float:
        m = max(row)
        return m + math.log(math.fsum(math.exp(x - m) for x in row if x > -math.inf))

    lt, ls = lse(t), lse(s)
    terms = []
    for a, b in zip(t, s, strict=True):
        if a == -math.inf:
            continue
        if b == -math.inf:
            return math.inf
        terms.append(math.exp(a - lt) * ((a - lt) - (b - ls)))
    return max(0.0, math.fsum(terms))


def _rows(seed: int, n: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = rng.normal(0, 4, (n, v)).astype(np.float32)
    s = (t + rng.normal(0, 0.5, (n, v))).astype(np.float32)
    return t, s


def test_pexp_and_plog_are_within_two_ulps_of_libm() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-708, 0, 200_000), rng.uniform(-1e-8, 1e-8, 1000), [0.0]])
    got = detkl.pexp(x)
    want = np.array([math.exp(v) for v in x])
    assert np.max(np.abs(got - want) / want) <= 2 * 2.0**-52
    assert detkl.pexp(np.array([-np.inf, -709.0, -1e6]))[:].tolist() == [0.0, 0.0, 0.0]
    for v in np.concatenate([rng.uniform(1e-3, 1e7, 20_000), [1.0, 2.0, 0.5, 49152.0]]):
        assert abs(detkl.plog(float(v)) - math.log(v)) <= 2 * 2.0**-52 * max(1.0, abs(math.log(v)))
    with pytest.raises(ValueError):
        detkl.plog(0.0)


def test_values_match_an_independent_float64_implementation_on_hostile_rows() -> None:
    t, s = _rows(2, 12, 3000)
    t[1, :100] = -np.inf  # holes in the teacher's support: 0 log 0 = 0
    s[2, 7] = -np.inf  # the student has no mass where the teacher has: +inf
    t[3, 5] = s[3, 5] = -np.inf  # both -inf: no term, no NaN
    t[4, [10, 20]] = t[4].max() + 1  # a tied teacher maximum
    s[5] = t[5]  # identical rows: exactly 0
    t[6] *= 30.0  # near one-hot teacher: tiny probabilities far below 2**-900
    s[7] = s[7] + 1e4  # unnormalized logits: renormalized in float64
    rec = detkl.batch(t, s)
    for i in range(len(t)):
        want = _slow_kl(t[i], s[i])
        got = float(rec["kl"][i])
        if math.isinf(want):
            assert math.isinf(got), i
        else:
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15), i
            assert got == pytest.approx(kld_math.exact_kl(t[i], s[i]), rel=1e-12, abs=1e-15)
    assert rec["kl"][5] == 0.0
    assert rec["flags"][4] & detkl.TIED and not rec["flags"][0] & detkl.TIED
    assert int(rec["top1"][0]) == int(np.argmax(s[0]))
    assert bool(rec["flags"][0] & detkl.AGREE) == (np.argmax(t[0]) == np.argmax(s[0]))
    with pytest.raises(ValueError, match="NaN"):
        detkl.batch(np.array([[0.0, np.nan]]), np.array([[0.0, 0.0]]))
    with pytest.raises(ValueError, match="no mass"):
        detkl.batch(np.array([[-np.inf, -np.inf]]), np.array([[0.0, 0.0]]))


_BYTES = """
import hashlib, json, sys, numpy as np
from pinwheel.serve.workers import detkl
rng = np.random.default_rng(7)
t = rng.normal(0, 4, (40, 5000)).astype(np.float32)
s = (t + rng.normal(0, 0.5, (40, 5000))).astype(np.float32)
x = rng.uniform(-700, 0, 100_000)
rec = detkl.batch(t, s)
print(json.dumps({"detkl": detkl.f64_sha256(rec["kl"]),
                  "pexp": hashlib.sha256(detkl.pexp(x).tobytes()).hexdigest(),
                  "np.exp": hashlib.sha256(np.exp(x).tobytes()).hexdigest()}))
"""


def test_the_bytes_are_the_same_under_every_numpy_cpu_feature_set() -> None:
    variants = {"all features": "", "AVX512 off": "AVX512F AVX512_SKX AVX512_ICL X86_V4",
                "AVX2/FMA3 off": "X86_V3 X86_V4 AVX512F AVX512_SKX AVX512_ICL AVX2 FMA3"}  # fmt: skip
    out = {}
    for name, off in variants.items():
        env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
        env["PYTHONPATH"] = str(SRC)
        if off:
            env["NPY_DISABLE_CPU_FEATURES"] = off
        proc = subprocess.run([sys.executable, "-c", _BYTES], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        out[name] = json.loads(proc.stdout)
    assert len({o["detkl"] for o in out.values()}) == 1, out
    assert len({o["pexp"] for o in out.values()}) == 1, out
    print("\ndetkl", out["all features"]["detkl"], "np.exp hashes:",
          sorted({o["np.exp"][:12] for o in out.values()}))  # fmt: skip


def test_score_positions_gives_detkl_bits_for_full_rows() -> None:
    """The reference (rows as JSON) and the in-process path share one code: same bits."""
    t, s = _rows(3, 6, 500)
    teacher = fidelity.Teacher(
        meta={}, offsets=np.array([0, 6]), target=np.zeros(6, np.int32),
        target_logprob=np.zeros(6, np.float32), top_ids=None, top_logprobs=None, full=t,
        sha256="", source="test",
    )  # fmt: skip
    student = [(np.arange(500), s[i].astype(np.float64), 0) for i in range(6)]
    kl, agree, exact, _ = fidelity.score_positions(teacher, student)
    rec = detkl.batch(t, s)
    assert exact and kl.tobytes() == rec["kl"].tobytes()
    assert (agree == ((rec["flags"] & detkl.AGREE) > 0)).all()
    assert detkl.canonical_bytes(kl) == kl.astype("<f8").tobytes()
    assert detkl.f64_sha256(kl) == hashlib.sha256(kl.astype("<f8").tobytes()).hexdigest()
    with pytest.raises(ValueError, match="NaN"):
        detkl.canonical_bytes([0.1, float("nan")])


def test_top1_ties_go_to_the_lowest_token_id_on_both_sides() -> None:
    """The one tie rule (docs/qualify.md): a tied maximum goes to the lowest token id."""
    t = [0.0, 2.0, 2.0, 1.0]  # tied at ids 1 and 2: top-1 is 1
    s = [0.0, 1.0, 3.0, 3.0]  # tied at ids 2 and 3: top-1 is 2
    _, agree, top, tied = detkl.position(t, s)
    assert top == 2 and tied and not agree
    _, agree, top, tied = detkl.position(s, s)
    assert top == 2 and agree and tied
    _, agree, top, tied = detkl.position([5.0, 0.0, 5.0, 5.0], [1.0, 0.0, 1.0, 0.0])
    assert top == 0 and agree and tied
