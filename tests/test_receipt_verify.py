"""`qualify verify-receipt` re-derives every conclusion of a receipt the writer wrote.

Real files throughout: a panel, a full-row teacher and a degraded student (mean KLD
~0.06 against `< 0.01`: a FAIL), scored by fidelity's own code, judged, written by the
report writer (receipt.json, fidelity_kld.f64, fidelity_flags.u8); then edited the way
issue 47 edited a real receipt. Each edit must be refused naming the field. Also: the
summary figures equal their pure-Python definition (kldsummary) bit for bit, strict
JSON for +inf, NaN refused, no traceback on hostile receipts, and the command runs
with numpy unimportable (the README's plain install has none; the subprocess blocks
the import, a stand-in for a venv without the qualify extra).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pinwheel.cli import main
from pinwheel.errors import PinwheelError
from pinwheel.manifest.serve import FidelityConfig
from pinwheel.serve import fidelity, kldsummary, verify
from pinwheel.serve.gates.base import Measured
from pinwheel.serve.gates.table import judge
from pinwheel.serve.receipt import SCHEMA, Receipt, Spread, number
from pinwheel.serve.report import write_outputs
from pinwheel.serve.workers import detkl
from test_qualify_fast import _profile

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


def _case(tmp: Path, sigma: float = 1.5, seed: int = 0, windows: int = 4, vocab: int = 40):
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(3, 9, windows)]
    ids = [list(rng.integers(0, vocab, n + 1)) for n in lengths]
    panel_sha = fidelity.write_panel(tmp / "panel.json", [[int(t) for t in w] for w in ids])
    panel = fidelity.read_panel(tmp / "panel.json", panel_sha)
    p = sum(lengths)
    full = rng.normal(0, 2, (p, vocab))
    full = (full - np.log(np.exp(full).sum(1, keepdims=True))).astype(np.float32)
    arrays = {
        "offsets": np.array([0, *np.cumsum(lengths)], np.int64),
        "target": np.array([t for w in ids for t in w[1:]], np.int32),
        "target_logprob": np.zeros(p, np.float32),
        "full": full,
    }
    meta = {"schema": fidelity.TEACHER_SCHEMA, "panel_sha256": panel_sha, "source": "test",
            "top_k": -1}  # fmt: skip
    data = fidelity.teacher_bytes(arrays, meta)
    (tmp / "t.npz").write_bytes(data)
    teacher = fidelity.load_teacher(data, "teacher")
    served = (full + rng.normal(0, sigma, full.shape)).astype(np.float32).astype(np.float64)
    return panel, teacher, served


def _write(tmp: Path, sigma: float = 1.5, served_override=None, **cfg_over) -> Path:
    panel, teacher, served = _case(tmp, sigma)
    if served_override is not None:
        served = served_override(served)
    rows = dict(arrays_of(teacher), full=served.astype(np.float32))
    (tmp / "s.npz").write_bytes(fidelity.teacher_bytes(rows, teacher.meta | {"source": "s"}))
    student = [(np.arange(served.shape[1]), row, 0) for row in served]
    kl, agree, exact, tied = fidelity.score_positions(teacher, student)
    result = fidelity.summarize(kl, agree, exact, tied=tied, panel=panel, teacher=teacher,
                                top_k=-1, resamples=200, seed=3)  # fmt: skip
    result = replace(result, served_rows_sha256=fidelity.served_rows_sha256(student, 40))
    cfg = FidelityConfig(panel=tmp / "panel.json", panel_sha256=panel.sha256, teacher=None,
                         teacher_sha256=None, teacher_url=None, top_k=-1, max_mean_kld=0.01,
                         min_top1=0.8, bootstrap=200, seed=3, strict=True)  # fmt: skip
    cfg = replace(cfg, **cfg_over)
    gates = judge(Measured(_profile(min_tok_s=50.0), single=Spread(40.0, 39.0, 41.0, 3)))
    gates += fidelity.judge(cfg, result)
    verdict = "FAIL" if any(g.status in ("FAIL", "NOT PROVEN") for g in gates) else "PASS"
    receipt = Receipt(
        schema=SCHEMA, verdict=verdict, profile="p",
        manifest={"name": "m", "path": "m.toml", "sha256": "ab" * 32}, provenance=None,
        server={}, started="2026-01-01T00:00:00Z", seconds=1.0, markers=(), decode=(),
        summary={}, concurrency=(), needles=(), gates=gates, reference={}, fidelity=result,
    )  # fmt: skip
    out = tmp / "out"
    write_outputs(receipt, out)
    return out / "receipt.json"


def arrays_of(teacher) -> dict:
    return {"offsets": teacher.offsets, "target": teacher.target,
            "target_logprob": teacher.target_logprob}  # fmt: skip


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _bad(path: Path) -> set[str]:
    got = verify.verify(verify.VerifyRequest(path))
    return {c.name for c in got.checks if c.status == "mismatch"}


@pytest.fixture
def written(tmp_path):
    return _write(tmp_path)


def test_a_fail_receipt_verifies_as_written(written, capsys):
    data = json.loads(written.read_text())
    assert data["verdict"] == "FAIL" and data["fidelity"]["mean_kld"] > 0.01
    got = verify.verify(verify.VerifyRequest(written))
    assert got.ok, [c for c in got.checks if c.status != "match"]
    names = {c.name for c in got.checks}
    for field in ("mean_kld", "ci95[0]", "ci95[1]", "median", "p99", "max", "top1"):
        assert f"fidelity.{field}" in names
    assert main(["qualify", "verify-receipt", str(written)]) == 0


def test_a_fail_receipt_edited_into_a_pass_is_refused_naming_the_fields(written, capsys):
    def to_pass(d):
        d["verdict"] = "PASS"
        for g in d["gates"]:
            g["status"] = "PASS"

    _edit(written, to_pass)
    bad = _bad(written)
    assert "verdict (from the gates)" in bad
    assert any("fidelity mean KLD" in b for b in bad), bad
    assert any("single-stream tok/s" in b for b in bad), bad  # 40 tok/s against >= 50
    assert main(["qualify", "verify-receipt", str(written)]) != 0
    assert "fidelity mean KLD" in capsys.readouterr().err


@pytest.mark.parametrize(
    "field, change",
    [
        ("top1", lambda f: f.update(top1=1.0)),
        ("max", lambda f: f.update(max=f["max"] * 0.5)),
        ("median", lambda f: f.update(median=f["median"] * 1.5)),
        ("p99", lambda f: f.update(p99=f["p99"] * 0.9)),
        ("ci95[0]", lambda f: f["ci95"].__setitem__(0, f["ci95"][0] * 0.5)),
        ("ci95[1]", lambda f: f["ci95"].__setitem__(1, f["ci95"][1] * 2)),
        ("mean_kld", lambda f: f.update(mean_kld=math.nextafter(f["mean_kld"], 0))),
        ("top1_ties", lambda f: f.update(top1_ties=f["top1_ties"] + 1)),
    ],
)
def test_an_edited_summary_figure_is_refused_naming_it(written, field, change):
    _edit(written, lambda d: change(d["fidelity"]))
    assert f"fidelity.{field}" in _bad(written)


@pytest.mark.parametrize("key", ["kld_f64_sha256", "kld_sha256", "flags_sha256",
                                 "served_rows_sha256", "teacher_sha256", "panel_sha256"])  # fmt: skip
def test_a_missing_hash_is_a_refusal_not_a_skip(written, key):
    _edit(written, lambda d: d["fidelity"].pop(key))
    with pytest.raises(PinwheelError, match=f"fidelity.{key}"):
        verify.verify(verify.VerifyRequest(written))
    assert main(["qualify", "verify-receipt", str(written)]) != 0


def test_the_values_and_flags_recompute_from_the_rows_then_a_one_ulp_change_is_named(
    tmp_path, capsys
):
    path = _write(tmp_path)
    req = verify.VerifyRequest(path, tmp_path / "t.npz", tmp_path / "s.npz")
    got = verify.verify(req)
    assert got.ok and {"fidelity.teacher_sha256", "fidelity.served_rows_sha256",
                       "per-position values (detkl, bit for bit)",
                       "per-position flags (top-1, ties) (detkl, bit for bit)"} <= {
        c.name for c in got.checks if c.status == "match"}  # fmt: skip
    f64 = path.parent / verify.F64
    vals = list(struct.unpack(f"<{f64.stat().st_size // 8}d", f64.read_bytes()))
    vals[3] = math.nextafter(vals[3], 1.0)
    f64.write_bytes(struct.pack(f"<{len(vals)}d", *vals))
    bad = {c.name for c in verify.verify(req).checks if c.status == "mismatch"}
    assert {"fidelity.kld_f64_sha256 (fidelity_kld.f64)",
            "per-position values (detkl, bit for bit)"} <= bad  # fmt: skip
    flags = path.parent / verify.FLAGS
    flipped = bytearray(flags.read_bytes())
    flipped[0] ^= 1
    flags.write_bytes(bytes(flipped))
    bad = {c.name for c in verify.verify(req).checks if c.status == "mismatch"}
    assert "per-position flags (top-1, ties) (detkl, bit for bit)" in bad
    assert main(["qualify", "verify-receipt", str(path), "--teacher", str(tmp_path / "t.npz"),
                 "--served", str(tmp_path / "s.npz")]) != 0  # fmt: skip


def test_a_value_moved_by_one_ulp_without_its_hash_is_refused(written):
    f64 = written.parent / verify.F64
    vals = list(struct.unpack(f"<{f64.stat().st_size // 8}d", f64.read_bytes()))
    vals[2] = math.nextafter(vals[2], math.inf)
    f64.write_bytes(struct.pack(f"<{len(vals)}d", *vals))
    _edit(written, lambda d: d["fidelity"].pop("kld_f64_sha256"))
    with pytest.raises(PinwheelError, match="kld_f64_sha256"):
        verify.verify(verify.VerifyRequest(written))


def test_other_served_rows_with_a_consistent_receipt_are_refused(tmp_path):
    """Issue 47: served_rows_sha256 deleted, other rows swapped in, the receipt rewritten to
    match them: the hash is required, so the swap cannot hide behind its absence."""
    path = _write(tmp_path)
    _edit(path, lambda d: d["fidelity"].pop("served_rows_sha256"))
    with pytest.raises(PinwheelError, match="served_rows_sha256"):
        verify.verify(verify.VerifyRequest(path, tmp_path / "t.npz", tmp_path / "s.npz"))


def test_nan_in_the_values_is_a_clear_refusal(written, capsys):
    f64 = written.parent / verify.F64
    raw = bytearray(f64.read_bytes())
    raw[8:16] = struct.pack("<d", math.nan)
    f64.write_bytes(bytes(raw))
    with pytest.raises(PinwheelError, match="position 1 is nan"):
        verify.verify(verify.VerifyRequest(written))
    assert main(["qualify", "verify-receipt", str(written)]) != 0
    assert "Traceback" not in capsys.readouterr().err


def test_an_infinite_kld_is_strict_json_and_reads_back_exactly(tmp_path):
    def no_mass(served):
        served[1, :] = -np.inf
        served[1, 0] = 0.0  # the student puts all its mass on one token: KLD +inf there
        return served

    path = _write(tmp_path, served_override=no_mass)
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    fid = data["fidelity"]
    assert fid["max"] == "inf" and fid["mean_kld"] == "inf" and number(fid["max"]) == math.inf
    got = verify.verify(verify.VerifyRequest(path))
    assert got.ok, [c for c in got.checks if c.status != "match"]
    gate = next(g for g in data["gates"] if g["name"] == fidelity.MEAN_GATE)
    assert gate["status"] == "FAIL" and gate["value"] == "inf"


def test_the_mean_is_fsum_over_n_and_the_figures_match_their_definition(tmp_path):
    """docs/qualify.md: mean = math.fsum(values) / n, so an independent verifier agrees
    (numpy's pairwise mean differed on 20-38% of panels); every other figure equals the
    pure-Python definition, bit for bit, whatever numpy did to compute it."""
    rng = np.random.default_rng(7)
    differ_from_numpy = 0
    for trial in range(40):
        n_windows = int(rng.integers(1, 9))
        lengths = [int(x) for x in rng.integers(1, 40, n_windows)]
        kl = rng.exponential(0.05, sum(lengths)) * 10.0 ** rng.integers(-8, 3)
        if trial % 7 == 0:
            kl[int(rng.integers(0, len(kl)))] = math.inf
        offsets = np.array([0, *np.cumsum(lengths)])
        (lo, hi), _ = fidelity.bootstrap_ci(kl, offsets, 150, trial)
        values = [float(x) for x in kl]
        want = kldsummary.figures(values, [1] * len(values), lengths, 150, trial)
        assert (lo, hi) == want.ci95, trial
        assert kldsummary.mean(values) == math.fsum(values) / len(values) or math.inf in values
        differ_from_numpy += float(np.mean(kl)) != kldsummary.mean(values)
    assert differ_from_numpy > 0  # the definition is not numpy's: it had to be stated


def test_the_single_window_bootstrap_matches_too():
    kl = np.random.default_rng(1).exponential(0.01, 300)
    (lo, hi), how = fidelity.bootstrap_ci(kl, np.array([0, 300]), 120, 5)
    want = kldsummary.figures([float(x) for x in kl], [0] * 300, [300], 120, 5)
    assert (lo, hi) == want.ci95 and "300 positions" in how


def test_verify_receipt_runs_without_numpy(written):
    code = (
        "import sys; sys.modules['numpy'] = None\n"  # `import numpy` raises ImportError
        "from pinwheel.cli import main\n"
        f"sys.exit(main(['qualify', 'verify-receipt', {str(written)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "match" in proc.stdout and "Traceback" not in proc.stderr


def test_detkl_never_turns_nan_into_zero():
    kl, agree, top, _ = detkl.position([1e308, -1e308, 0, 0], [0, 0, 0, 0])
    assert kl == math.log(4) and agree and top == 0  # the teacher is a point mass on 0
    for bad in ([math.nan, 0, 0, 0], [math.inf, 0, 0, 0]):
        for args in ((bad, [0, 0, 0, 0]), ([0, 0, 0, 0], bad)):
            with pytest.raises(ValueError, match="NaN"):
                detkl.position(*args)


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=20), st.just("inf"), st.just("nan"), st.just("\x1b[2J\x00"),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                          max_size=2),
)  # fmt: skip


@FUZZ
@given(data=st.data())
def test_fuzz_hostile_receipts_are_refused_or_checked_never_a_traceback(written, data):
    orig = written.parent / "as-written.json"  # every example starts from the writer's
    if not orig.exists():
        orig.write_text(written.read_text())
    doc = json.loads(orig.read_text())
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.sampled_from(["top", "fidelity", "gate", "spot"]))
        if where == "top":
            target = doc
        elif where == "fidelity" and isinstance(doc.get("fidelity"), dict):
            target = doc["fidelity"]
        elif where == "gate" and isinstance(doc.get("gates"), list) and doc["gates"]:
            target = doc["gates"][data.draw(st.integers(0, len(doc["gates"]) - 1))]
        else:
            continue
        if not isinstance(target, dict) or not target:
            continue
        key = data.draw(st.sampled_from(sorted(target)))
        if data.draw(st.booleans()):
            target.pop(key)
        else:
            target[key] = data.draw(JUNK)
    written.write_text(json.dumps(doc, allow_nan=True))
    try:
        verify.verify(verify.VerifyRequest(written))
    except PinwheelError as exc:
        assert exc.what and exc.next


def test_hostile_bytes_give_a_refusal(written, capsys):
    for text in ("[1, 2]", '{"schema": NaN}', '{"fidelity": 1e999}', "\x00\x01", "{" * 100):
        written.write_text(text)
        assert main(["qualify", "verify-receipt", str(written)]) != 0
        assert "Traceback" not in capsys.readouterr().err
    written.write_bytes(hashlib.sha256(b"x").digest())
    assert main(["qualify", "verify-receipt", str(written)]) != 0


def test_a_large_bootstrap_is_checked_with_numpy_when_it_is_there(written, monkeypatch):
    """Above FAST_CI_DRAWS the CI comes from fidelity.bootstrap_ci (the same bits as the
    pure-Python definition; without numpy the pure loop runs, only slower)."""
    values = [float(x) for x in np.random.default_rng(2).exponential(0.02, 500)]
    pure = kldsummary.figures(values, [1] * 500, [500], 300, 9).ci95
    monkeypatch.setattr(verify, "FAST_CI_DRAWS", 0)
    assert verify._numpy_ci(values, [500], 300, 9) == pure
    assert verify.verify(verify.VerifyRequest(written)).ok
