"""KLD figures with the right sign, on adversarial data, against exact float64 values.

Every case builds float64 log-probability rows (the "true" distributions), serves
them the way a real pipeline does (float32 values, the server's top-K plus the
prompt token, a teacher file with float32 top-K or full rows), scores them with
``fidelity.score_positions`` and compares with the exact KLD of the float64 rows.
Found by review (issue 22): the top-K + tail figure came out ABOVE the exact KLD
with float32 tails, a max_mean_kld gate PASSed a model with disjoint top-K sets,
-inf log-probabilities gave NaN, and kld_sha256 changed with numpy's CPU features.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pinwheel.serve import fidelity
from test_fidelity import _cfg

V = 400


def _norm(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - (m + np.log(np.sum(np.exp(x - m))))


def _exact(t: np.ndarray, s: np.ndarray) -> float:
    """KLD of two float64 log-probability rows, 0 * log 0 = 0, by math.fsum."""
    terms = [
        (math.inf if b == -math.inf else math.exp(a) * (a - b))
        for a, b in zip(t.tolist(), s.tolist(), strict=True)
        if a != -math.inf
    ]
    return math.fsum(terms)


def _score(tmp_path, t_rows, s_rows, *, top_k: int, teacher_k: int, targets=None):
    """Serve rows as float32 through the pipeline: (kld, agree, exact, [ties], teacher, panel)."""
    P = len(t_rows)
    rng = np.random.default_rng(0)
    targets = rng.integers(0, V, P) if targets is None else np.asarray(targets)
    windows = [[int(targets[0])] + [int(x) for x in targets]]  # one window of P+1 tokens
    fidelity.write_panel(tmp_path / "panel.json", windows)
    panel = fidelity.read_panel(tmp_path / "panel.json", None)
    t32 = np.asarray(t_rows, np.float32)
    arrays = {
        "offsets": np.array([0, P], np.int64),
        "target": targets.astype(np.int32),
        "target_logprob": t32[np.arange(P), targets],
    }
    if teacher_k == -1:
        arrays["full"] = t32
    else:
        ids = np.stack([np.lexsort((np.arange(V), -r))[:teacher_k] for r in t32]).astype(np.int32)
        arrays |= {"top_ids": ids, "top_logprobs": np.take_along_axis(t32, ids, 1)}
    meta = {"schema": fidelity.TEACHER_SCHEMA, "panel_sha256": panel.sha256, "source": "t"}
    teacher = fidelity.load_teacher(fidelity.teacher_bytes(arrays, meta), "test")
    student = []
    for p, row in enumerate(np.asarray(s_rows, np.float32)):
        order = np.lexsort((np.arange(V), -row))
        keep = list(range(V)) if top_k == -1 else [*order[:top_k].tolist(), int(targets[p])]
        entry = {str(i): {"logprob": float(row[i]), "rank": 1} for i in dict.fromkeys(keep)}
        student.append(fidelity.parse_position(json.loads(json.dumps(entry))))
    out = fidelity.score_positions(teacher, student)
    return (out[0], out[1], out[2], list(out[3:]), teacher, panel)


def _log_softmax_f32(logits: np.ndarray) -> np.ndarray:
    """An engine's float32 log-softmax (its normalizer carries float32 rounding)."""
    x = logits.astype(np.float32)
    m = x.max()
    return (x - (m + np.log(np.sum(np.exp(x - m), dtype=np.float32)))).astype(np.float32)


def _peaked_logits(rng, n, peak, noise):
    """Teacher and student both near-certain of one token: tails of ~1e-6..1e-9."""
    t_rows, s_rows = [], []
    for _ in range(n):
        t = rng.normal(0, 2, V)
        t[int(rng.integers(V))] += peak
        t_rows.append(t)
        s_rows.append(t + rng.normal(0, noise, V))
    return np.array(t_rows), np.array(s_rows)


@pytest.mark.parametrize("teacher_k", [-1, 32])
@pytest.mark.parametrize(("peak", "noise"), [(18.0, 0.01), (22.0, 0.02), (16.0, 0.001)])
def test_top_k_figure_never_exceeds_the_exact_kld_with_float32_tails(
    tmp_path, teacher_k, peak, noise
):
    # Old code: the 1e-12 tail clamp and float32 rows summing above 1 put about a quarter
    # of these positions ABOVE the exact KLD (up to hundreds of times).
    rng = np.random.default_rng(3)
    t_logits, s_logits = _peaked_logits(rng, 120, peak, noise)
    want = np.array([_exact(_norm(t), _norm(s)) for t, s in zip(t_logits, s_logits, strict=True)])
    served_t = np.array([_log_softmax_f32(x) for x in t_logits])
    served_s = np.array([_log_softmax_f32(x) for x in s_logits])
    kld, _agree, exact, *_ = _score(tmp_path, served_t, served_s, top_k=20, teacher_k=teacher_k)
    assert not exact
    above = int((kld > want).sum())
    assert above == 0, f"{above} of {len(kld)} positions above the exact KLD"
    assert (kld >= 0).all()


def test_disjoint_top_k_sets_bound_and_fail_the_gate(tmp_path):
    # Teacher's and student's top-20 share no token: the exact KLD is ~10+ nats.
    rng = np.random.default_rng(5)
    t_rows, s_rows = [], []
    for _ in range(40):
        t = rng.normal(0, 1, V)
        s = rng.normal(0, 1, V)
        t[:20] += 12  # teacher: mass on tokens 0..19
        s[200:220] += 12  # student: mass on tokens 200..219
        t_rows.append(_norm(t))
        s_rows.append(_norm(s))
    t_rows, s_rows = np.array(t_rows), np.array(s_rows)
    want = np.array([_exact(t, s) for t, s in zip(t_rows, s_rows, strict=True)])
    assert want.mean() > 10
    kld, agree, exact, _ties, teacher, panel = _score(
        tmp_path, t_rows, s_rows, top_k=20, teacher_k=20, targets=rng.integers(20, 200, 40)
    )
    assert not exact and (kld <= want).all()
    assert kld.mean() > 5  # the unreturned tokens are capped by the K-th value: a useful bound
    r = fidelity.summarize(kld, agree, exact, panel=panel, teacher=teacher, top_k=20,
                           resamples=100, seed=0)  # fmt: skip
    cfg = _cfg(max_mean_kld=5.0, min_top1=None)
    (gate,) = fidelity.judge(cfg, r)
    assert gate.status == "FAIL", gate  # old code: PASS (1.04 "nats" against an exact 14)


def test_a_lower_bound_never_passes_the_gate(tmp_path):
    rng = np.random.default_rng(7)
    t_rows = np.array([_norm(rng.normal(0, 3, V)) for _ in range(30)])
    s_rows = np.array([_norm(t + rng.normal(0, 0.2, V)) for t in t_rows])
    kld, agree, exact, _ties, teacher, panel = _score(tmp_path, t_rows, s_rows, top_k=20,
                                                      teacher_k=-1)  # fmt: skip
    r = fidelity.summarize(kld, agree, exact, panel=panel, teacher=teacher, top_k=20,
                           resamples=100, seed=0)  # fmt: skip
    assert r.bound == "lower" and r.method == "top-20+tail"
    (gate,) = fidelity.judge(_cfg(max_mean_kld=10.0, strict=True, min_top1=None), r)
    assert gate.status == "NOT PROVEN" and "lower bound" in gate.measured
    assert "never a PASS" in gate.detail
    (low,) = fidelity.judge(_cfg(max_mean_kld=1e-6, strict=True, min_top1=None), r)
    assert low.status == "FAIL"


def test_peaked_student_on_another_token(tmp_path):
    rng = np.random.default_rng(11)
    t_rows, s_rows = [], []
    for _ in range(60):
        t = _norm(rng.normal(0, 2, V))
        s = rng.normal(0, 2, V)
        s[int(rng.integers(V))] += 30  # the student is certain (tail ~1e-12) of one token
        t_rows.append(t)
        s_rows.append(_norm(s))
    t_rows, s_rows = np.array(t_rows), np.array(s_rows)
    want = np.array([_exact(t, s) for t, s in zip(t_rows, s_rows, strict=True)])
    for teacher_k in (-1, 20):
        kld, *_ = _score(tmp_path, t_rows, s_rows, top_k=5, teacher_k=teacher_k)
        assert (kld <= want).all() and kld.mean() > 0.5 * want.mean()


def test_full_rows_are_exact_even_from_float32(tmp_path):
    rng = np.random.default_rng(13)
    t_rows = np.array([_norm(rng.normal(0, 3, V)) for _ in range(20)])
    s_rows = np.array([_norm(t + rng.normal(0, 0.3, V)) for t in t_rows])
    kld, _agree, exact, *_ = _score(tmp_path, t_rows, s_rows, top_k=-1, teacher_k=-1)
    assert exact
    t32 = t_rows.astype(np.float32).astype(np.float64)
    s32 = s_rows.astype(np.float32).astype(np.float64)
    for p in range(len(kld)):
        assert kld[p] == pytest.approx(_exact(_norm(t32[p]), _norm(s32[p])), rel=1e-12)
        assert kld[p] == pytest.approx(_exact(t_rows[p], s_rows[p]), rel=1e-5)


def test_masked_tokens_follow_zero_log_zero(tmp_path):
    # Old code: a teacher with 8 masked (-inf) vocabulary entries made every position NaN.
    rng = np.random.default_rng(17)
    t_rows, s_rows = [], []
    for _ in range(25):
        t = rng.normal(0, 3, V)
        t[V - 8 :] = -np.inf
        s = t + rng.normal(0, 0.3, V)
        s[V - 8 :] = rng.normal(-20, 1, 8)  # the student gives them a little mass
        t_rows.append(_norm(t))
        s_rows.append(_norm(s))
    t_rows, s_rows = np.array(t_rows), np.array(s_rows)
    want = np.array([_exact(t, s) for t, s in zip(t_rows, s_rows, strict=True)])
    kld, _agree, exact, *_ = _score(tmp_path, t_rows, s_rows, top_k=-1, teacher_k=-1)
    assert exact and np.isfinite(kld).all()
    np.testing.assert_allclose(kld, want, rtol=1e-5)
    lb, _agree, exact, *_ = _score(tmp_path, t_rows, s_rows, top_k=20, teacher_k=-1)
    assert not exact and np.isfinite(lb).all() and (lb <= want).all()


def test_student_without_mass_where_the_teacher_has_some_is_infinite(tmp_path):
    rng = np.random.default_rng(19)
    t_rows = np.array([_norm(rng.normal(0, 1, V)) for _ in range(6)])
    s_rows = t_rows.copy()
    s_rows[:, 3] = -np.inf  # the student masks token 3; the teacher gives it ~1/V
    s_rows = np.array([_norm(s) for s in s_rows])
    kld, agree, exact, _ties, teacher, panel = _score(tmp_path, t_rows, s_rows, top_k=-1,
                                                      teacher_k=-1)  # fmt: skip
    assert exact and (kld == math.inf).all()
    r = fidelity.summarize(kld, agree, exact, panel=panel, teacher=teacher, top_k=-1,
                           resamples=100, seed=0)  # fmt: skip
    assert r.mean_kld == math.inf
    (gate,) = fidelity.judge(_cfg(max_mean_kld=100.0, min_top1=None), r)
    assert gate.status == "FAIL"


def test_nan_log_probabilities_are_refused(tmp_path):
    rng = np.random.default_rng(23)
    t_rows = np.array([_norm(rng.normal(0, 1, V)) for _ in range(3)])
    s_rows = t_rows.copy()
    s_rows[1, 5] = np.nan
    with pytest.raises(fidelity.VerifyError, match="NaN"):
        _score(tmp_path, t_rows, s_rows, top_k=-1, teacher_k=-1)


def test_one_tie_rule_on_both_sides_and_ties_counted(tmp_path):
    # Token 7 and token 3 tie at the top on both sides; the server lists 7 first (rank 1).
    t = np.full(V, -10.0)
    t[[3, 7]] = 0.0
    t = _norm(t)
    fidelity.write_panel(tmp_path / "p.json", [[1, 2]])
    panel = fidelity.read_panel(tmp_path / "p.json", None)
    arrays = {
        "offsets": np.array([0, 1], np.int64),
        "target": np.array([2], np.int32),
        "target_logprob": t.astype(np.float32)[[2]],
        "full": t.astype(np.float32)[None, :],
    }
    meta = {"schema": fidelity.TEACHER_SCHEMA, "panel_sha256": panel.sha256, "source": "t"}
    teacher = fidelity.load_teacher(fidelity.teacher_bytes(arrays, meta), "test")
    entry = {
        "7": {"logprob": float(np.float32(t[7])), "rank": 1},
        "3": {"logprob": float(np.float32(t[3])), "rank": 2},
        "2": {"logprob": float(np.float32(t[2])), "rank": 3},
    }
    kld, agree, exact, *rest = fidelity.score_positions(teacher, [fidelity.parse_position(entry)])
    assert bool(agree[0])  # both sides: token 3 (the lowest id among the tied maximum)
    assert rest == [1]


# --------------------------------------------------------------------------- the hash

_HASH = r"""
import json, sys
import numpy as np
from pinwheel.serve import fidelity, kld as kld_math
dtype = sys.argv[1]
rng = np.random.default_rng(29)
V, P = 2000, 200
t = rng.normal(0, 3, (P, V)); s = t + rng.normal(0, 0.3, (P, V))
t = (t - np.log(np.exp(t).sum(1, keepdims=True))).astype(np.float32)
s = (s - np.log(np.exp(s).sum(1, keepdims=True))).astype(np.float32)
targets = rng.integers(0, V, P)
meta = {"schema": fidelity.TEACHER_SCHEMA, "panel_sha256": "0" * 64, "source": "t"}
arrays = {"offsets": np.array([0, P]), "target": targets.astype(np.int32),
          "target_logprob": t[np.arange(P), targets], "full": t}  # a teacher file holds f4
teacher = fidelity.load_teacher(fidelity.teacher_bytes(arrays, meta), "t")
rows = [(np.arange(V), s[p].astype(dtype), 0) for p in range(P)]
kld = fidelity.score_positions(teacher, rows)[0]
direct = [kld_math.exact_kl(t[p].astype(dtype), s[p].astype(dtype)) for p in range(P)]
print(json.dumps({"sha": fidelity.kld_sha256(kld), "direct": kld_math.kld_sha256(direct)}))
"""


def _hash(env_extra: dict[str, str], dtype: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"} | env_extra
    env["PYTHONPATH"] = str(Path(__file__).parent.parent / "src")
    out = subprocess.run(
        [sys.executable, "-c", _HASH, dtype], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def _dispatched() -> list[str]:
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]


def test_kld_sha256_is_the_same_under_every_numpy_cpu_feature_set_and_input_dtype():
    on = _dispatched()
    if not on:
        pytest.skip("this numpy dispatches no CPU feature above its baseline here")
    variants = [{}]  # every feature numpy dispatches to on this CPU
    for i in range(len(on)):  # then switch them off from the top, down to the baseline
        variants.append({"NPY_DISABLE_CPU_FEATURES": " ".join(on[i:])})
    results = [_hash(v, "float64") for v in variants] + [_hash({}, "float32")]
    shas = {r["sha"] for r in results} | {r["direct"] for r in results}
    assert len(shas) == 1, [(v, r) for v, r in zip(variants, results, strict=False)]
    print("\nkld_sha256", shas.pop(), "under", variants, "and float32 inputs")
