"""Fidelity arithmetic, bootstrap determinism, gates and serving statistics, without a server.

The KLD figures are checked against an independent computation in plain Python
(math.fsum over dicts) on the same log-probabilities."""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pinwheel.errors import ManifestError, UsageError, VerifyError
from pinwheel.manifest import model as manifest
from pinwheel.manifest.serve import FidelityConfig, QualifyProfile, Slo
from pinwheel.serve import fidelity
from pinwheel.serve.gates.base import Measured
from pinwheel.serve.gates.table import judge

V = 50


def _logsoftmax(rng: random.Random, scale: float = 3.0) -> list[float]:
    xs = [rng.gauss(0, scale) for _ in range(V)]
    m = max(xs)
    z = m + math.log(math.fsum(math.exp(x - m) for x in xs))
    return [x - z for x in xs]


def _plain_full(t: list[float], s: list[float]) -> float:
    tz = math.log(math.fsum(math.exp(x) for x in t))
    sz = math.log(math.fsum(math.exp(x) for x in s))
    return math.fsum(math.exp(a - tz) * ((a - tz) - (b - sz)) for a, b in zip(t, s, strict=True))


def _plain_coarse(t: dict[int, float], s: dict[int, float]) -> float:
    both = [i for i in s if i in t]
    pt = [math.exp(t[i]) for i in both]
    ps = [math.exp(s[i]) for i in both]
    tt = max(1 - math.fsum(pt), 1e-12)
    ts = max(1 - math.fsum(ps), 1e-12)
    body = math.fsum(a * (math.log(a) - math.log(b)) for a, b in zip(pt, ps, strict=True))
    return body + tt * (math.log(tt) - math.log(ts))


def _windows(rng: random.Random, n: int, length: int) -> list[list[int]]:
    return [[rng.randrange(V) for _ in range(length)] for _ in range(n)]


def _entry(row: list[float], keep: list[int]) -> dict[str, dict]:
    order = sorted(range(V), key=lambda i: (-row[i], i))
    rank = {i: r + 1 for r, i in enumerate(order)}
    return {str(i): {"logprob": row[i], "rank": rank[i]} for i in keep}


def _case(tmp_path, top_k: int, teacher_k: int):
    """A panel, teacher and student rows over a 50-token vocabulary."""
    rng = random.Random(7)
    windows = _windows(rng, 6, 9)
    panel_path = tmp_path / "panel.json"
    fidelity.write_panel(panel_path, windows)
    panel = fidelity.read_panel(panel_path, None)
    t_rows, s_rows, student = [], [], []
    for w in windows:
        for j in range(1, len(w)):
            t = _logsoftmax(rng)
            s = [x + rng.gauss(0, 0.3) for x in t]  # a perturbed student, renormalized
            sz = math.log(math.fsum(math.exp(x) for x in s))
            s = [x - sz for x in s]
            t_rows.append(t)
            s_rows.append(s)
            order = sorted(range(V), key=lambda i: (-s[i], i))
            keep = list(range(V)) if top_k == -1 else [w[j], *order[:top_k]]
            student.append(fidelity.parse_position(_entry(s, list(dict.fromkeys(keep)))))
    full = np.array(t_rows, np.float32)
    targets = np.array([t for w in windows for t in w[1:]], np.int64)
    arrays = {
        "offsets": np.array([0] + [len(w) - 1 for w in windows], np.int64).cumsum(),
        "target": targets.astype(np.int32),
        "target_logprob": full[np.arange(len(targets)), targets],
    }
    if teacher_k == -1:
        arrays["full"] = full
    else:
        ids = np.argsort(-full, axis=1, kind="stable")[:, :teacher_k].astype(np.int32)
        arrays |= {"top_ids": ids, "top_logprobs": np.take_along_axis(full, ids, 1)}
    meta = {"schema": fidelity.TEACHER_SCHEMA, "panel_sha256": panel.sha256, "source": "test"}
    teacher = fidelity.load_teacher(fidelity.teacher_bytes(arrays, meta), "test")
    return panel, teacher, student, full, s_rows, windows


def test_full_vocabulary_kld_matches_plain_math(tmp_path):
    panel, teacher, student, full, s_rows, _ = _case(tmp_path, top_k=-1, teacher_k=-1)
    kld, agree, all_full, _ = fidelity.score_positions(teacher, student)
    assert all_full and len(kld) == panel.positions == 48
    for p in range(len(kld)):
        want = _plain_full([float(x) for x in full[p]], [float(x) for x in s_rows[p]])
        assert kld[p] == pytest.approx(want, rel=1e-9, abs=1e-13)
        t_top = max(range(V), key=lambda i: (full[p][i], -i))
        s_top = max(range(V), key=lambda i: (s_rows[p][i], -i))
        assert bool(agree[p]) == (t_top == s_top)
    assert kld.min() > 0


@pytest.mark.parametrize("teacher_k", [-1, 8])
def test_top_k_tail_kld_is_a_lower_bound_of_the_full_kld(tmp_path, teacher_k):
    panel, teacher, student, full, s_rows, windows = _case(tmp_path, top_k=5, teacher_k=teacher_k)
    kld, _, all_full, _ = fidelity.score_positions(teacher, student)
    assert not all_full
    want = [_plain_full([float(x) for x in full[p]], s_rows[p]) for p in range(len(kld))]
    assert all(0 <= kld[p] <= want[p] for p in range(len(kld)))
    # and not a vacuous one: the bound holds a good part of the KLD on this data
    assert math.fsum(kld) > 0.2 * math.fsum(want)


def test_summary_sha_and_bootstrap_are_deterministic(tmp_path):
    panel, teacher, student, *_ = _case(tmp_path, top_k=5, teacher_k=-1)
    kld, agree, all_full, _ = fidelity.score_positions(teacher, student)
    kw = dict(panel=panel, teacher=teacher, top_k=5, resamples=1000, seed=0)
    a = fidelity.summarize(kld, agree, all_full, **kw)
    b = fidelity.summarize(kld.copy(), agree, all_full, **kw)
    assert a == b and a.ci95 == b.ci95
    text = "".join(f"{x:.9f}\n" for x in kld).encode()  # the documented canonical form
    assert a.kld_sha256 == hashlib.sha256(text).hexdigest()
    assert a.ci95[0] <= a.mean_kld <= a.ci95[1]
    assert a.method == "top-5+tail" and a.positions == 48 and a.windows == 6
    assert a.mean_kld == pytest.approx(math.fsum(kld) / len(kld))
    assert a.p99 == pytest.approx(float(np.percentile(kld, 99)))
    other = fidelity.summarize(kld, agree, all_full, **(kw | {"seed": 1}))
    assert other.ci95 != a.ci95
    assert "6 windows" in a.ci_method


def test_teacher_file_is_byte_reproducible_and_pinned(tmp_path):
    arrays = {"offsets": np.array([0, 2]), "target": np.array([1, 2], np.int32)}
    meta = {"schema": fidelity.TEACHER_SCHEMA}
    one = fidelity.teacher_bytes(arrays, meta)
    assert one == fidelity.teacher_bytes(arrays, meta)
    with np.load(__import__("io").BytesIO(one)) as z:
        assert list(z["target"]) == [1, 2]
    path = tmp_path / "t.npz"
    path.write_bytes(one)
    with pytest.raises(VerifyError, match="teacher sha256"):
        fidelity.read_teacher(path, "0" * 64)


def test_panel_is_pinned(tmp_path):
    sha = fidelity.write_panel(tmp_path / "p.json", [[1, 2, 3]])
    assert fidelity.read_panel(tmp_path / "p.json", sha).positions == 2
    with pytest.raises(VerifyError, match="panel sha256"):
        fidelity.read_panel(tmp_path / "p.json", "f" * 64)
    (tmp_path / "t.json").write_text(
        json.dumps({"schema": fidelity.PANEL_SCHEMA, "texts": ["a b c"], "window": 2})
    )
    p = fidelity.read_panel(tmp_path / "t.json", None, lambda text: [5, 6, 7])
    assert p.windows == ((5, 6),)


def _cfg(**kw) -> FidelityConfig:
    base = FidelityConfig(
        panel=__import__("pathlib").Path("p"),
        panel_sha256="a" * 64,
        teacher=None,
        teacher_sha256=None,
        teacher_url="http://x",
        top_k=20,
        max_mean_kld=1e-4,
        min_top1=0.95,
        bootstrap=1000,
        seed=0,
    )
    return replace(base, **kw)


def test_fidelity_gates_judge_the_raw_value(tmp_path):
    panel, teacher, student, *_ = _case(tmp_path, top_k=-1, teacher_k=-1)
    kld, agree, full, _ = fidelity.score_positions(teacher, student)
    r = fidelity.summarize(kld, agree, full, panel=panel, teacher=teacher, top_k=-1,
                           resamples=100, seed=0)  # fmt: skip
    assert r.bound == "exact"
    just_over = replace(r, mean_kld=1.0000001e-4, top1=0.9499996)
    gates = {g.name: g for g in fidelity.judge(_cfg(), just_over)}
    kl = gates["fidelity mean KLD (nats)"]
    assert kl.status == "FAIL" and kl.measured == "0.00010000001"  # the raw value
    t1 = gates["fidelity top-1 agreement"]
    assert t1.status == "FAIL" and t1.measured == "0.9499996"
    ok = {g.name: g.status for g in fidelity.judge(_cfg(), replace(r, mean_kld=1e-4, top1=0.95))}
    assert set(ok.values()) == {"PASS"}
    missing = fidelity.judge(_cfg(), None)
    assert {g.status for g in missing} == {"FAIL"}


def test_strict_thresholds_as_the_card_writes_them(tmp_path):
    # A card that says "mean KLD < 0.06" fails a model at exactly 0.06 (old code: <= PASSed).
    panel, teacher, student, *_ = _case(tmp_path, top_k=-1, teacher_k=-1)
    kld, agree, full, _ = fidelity.score_positions(teacher, student)
    r = fidelity.summarize(kld, agree, full, panel=panel, teacher=teacher, top_k=-1,
                           resamples=100, seed=0)  # fmt: skip
    at = replace(r, mean_kld=0.06)
    gates = {g.name: g for g in fidelity.judge(_cfg(max_mean_kld=0.06, strict=True), at)}
    assert gates["fidelity mean KLD (nats)"].status == "FAIL"
    assert gates["fidelity mean KLD (nats)"].threshold == "< 0.06"
    loose = {g.name: g for g in fidelity.judge(_cfg(max_mean_kld=0.06), at)}
    assert loose["fidelity mean KLD (nats)"].status == "PASS"


def test_ms_per_pass_gate_fails_when_not_measurable():
    prof = QualifyProfile("p", (1,), (), (), 8, None, 33.0, None, None, ())
    (gate,) = judge(Measured(prof))
    assert gate.status == "FAIL" and gate.measured == "not measurable"


def test_manifest_fidelity_table(tmp_path):
    path = tmp_path / "m.toml"
    head = (
        '[manifest]\nname = "x"\n[upstream]\nurl = "https://example.com/x.git"\n'
        f'commit = "{"c" * 40}"\nbranch = "main"\n[qualify]\nprompts = ["hi"]\n'
        "slo = { ttft_ms = 500, e2el_ms = 9000 }\n[qualify.profile.p]\nconcurrency = [1]\n"
    )
    path.write_text(
        head
        + "[qualify.fidelity]\n"
        + f'panel = {{ file = "fid/panel.json", sha256 = "{"a" * 64}" }}\n'
        + 'teacher = { url = "http://ref:8000" }\ntop_k = -1\nmax_mean_kld = 0.06\n'
    )
    q = manifest.load(path).require("qualify")
    assert q.fidelity.panel == tmp_path / "fid" / "panel.json"
    assert q.fidelity.teacher_url == "http://ref:8000" and q.fidelity.top_k == -1
    assert q.slo == Slo(ttft_ms=500.0, tpot_ms=None, e2el_ms=9000.0)
    path.write_text(
        head + '[qualify.fidelity]\npanel = { dataset = "org/x", revision = "abc" }\n'
        'teacher = { url = "http://ref" }\n'
    )
    with pytest.raises(ManifestError, match="hub dataset"):
        manifest.load(path).require("qualify")


@pytest.mark.parametrize(
    "line",
    [
        "max_mean_kld = nan",
        "max_mean_kld = inf",
        "max_mean_kld = -inf",
        "min_top1 = nan",
        "bootstrap = 100\nmin_top1 = inf",
    ],
)
def test_thresholds_that_are_no_gate_are_refused_at_load(tmp_path, line):
    # Old code: nan loaded (every run FAILs), inf loaded (every run PASSes).
    path = tmp_path / "m.toml"
    path.write_text(
        '[manifest]\nname = "x"\n[upstream]\nurl = "https://example.com/x.git"\n'
        f'commit = "{"c" * 40}"\nbranch = "main"\n[qualify]\nprompts = ["hi"]\n'
        "[qualify.profile.p]\nconcurrency = [1]\n[qualify.fidelity]\n"
        f'panel = {{ file = "p.json", sha256 = "{"a" * 64}" }}\n'
        f'teacher = {{ url = "http://ref:8000" }}\n{line}\n'
    )
    with pytest.raises(ManifestError, match="finite") as err:
        manifest.load(path).require("qualify")
    key = line.split("\n")[-1].split()[0]
    assert "m.toml" in str(err.value.where) and key in str(err.value.where)


@pytest.mark.parametrize("key", ["min_tok_s", "max_ms_per_pass", "min_aggregate_tok_s"])
def test_profile_gates_refuse_nan_and_inf(tmp_path, key):
    path = tmp_path / "m.toml"
    for bad in ("nan", "inf"):
        path.write_text(
            '[manifest]\nname = "x"\n[upstream]\nurl = "https://example.com/x.git"\n'
            f'commit = "{"c" * 40}"\nbranch = "main"\n[qualify]\nprompts = ["hi"]\n'
            f"[qualify.profile.p]\nconcurrency = [1]\n{key} = {bad}\n"
        )
        with pytest.raises(ManifestError, match="finite"):
            manifest.load(path).require("qualify")


def test_qualification_server_is_allowed_the_panels_log_probabilities():
    # vLLM caps prompt_logprobs at --max-logprobs (20 by default): a full-vocabulary
    # (exact) fidelity run needs -1, so the server qualify starts gets it.
    assert fidelity.server_flags(_cfg(top_k=-1), ["--dtype", "float32"]) == (
        "--max-logprobs",
        "-1",
    )
    assert fidelity.server_flags(_cfg(top_k=128), []) == ("--max-logprobs", "128")
    assert fidelity.server_flags(_cfg(top_k=20), []) == ()
    assert fidelity.server_flags(_cfg(top_k=-1), ["--max-logprobs", "-1"]) == ()
    assert fidelity.server_flags(_cfg(top_k=128), ["--max-logprobs=200"]) == ()
    assert fidelity.server_flags(None, []) == ()
    with pytest.raises(UsageError, match="--max-logprobs 20") as err:
        fidelity.server_flags(_cfg(top_k=-1), ["--max-logprobs", "20"])
    assert "--max-logprobs -1" in str(err.value.next)


def test_qualify_starts_the_server_with_the_log_probabilities_it_asks_for(tmp_path):
    # The server qualify starts must allow top_k = -1 (full rows): a stand-in python
    # records the argv it was started with and exits, like a server that failed to start.
    from pinwheel.cli import main

    fixture = Path(__file__).parent / "fixtures" / "qualify-fidelity-cpu.toml"
    m = tmp_path / "m.toml"
    m.write_text(fixture.read_text().replace("top_k = 20", "top_k = -1"))
    argv_file = tmp_path / "argv"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{argv_file}"\nexit 3\n')
    python.chmod(0o755)
    (tmp_path / "model").mkdir()
    code = main(["qualify", "--manifest", str(m), "--profile", "bf16", "--model",
                 str(tmp_path / "model"), "--python", str(python), "--out",
                 str(tmp_path / "out")])  # fmt: skip
    assert code == 1  # the stand-in exited: the server never became healthy
    argv = argv_file.read_text().splitlines()
    i = argv.index("--max-logprobs")
    assert argv[i + 1] == "-1"


def test_a_gate_with_a_nan_or_fewer_positions_than_its_panel_fails(tmp_path):
    """Issue 50: a NaN mean must never PASS (NaN compares false both ways), nor a result
    that scored fewer positions than the panel holds."""
    panel, teacher, student, *_ = _case(tmp_path, top_k=-1, teacher_k=-1)
    kld, agree, full, _ = fidelity.score_positions(teacher, student)
    r = fidelity.summarize(kld, agree, full, panel=panel, teacher=teacher, top_k=-1,
                           resamples=100, seed=0)  # fmt: skip
    good = replace(r, mean_kld=1e-5, top1=0.99)
    for cfg in (_cfg(), _cfg(strict=True), _cfg(tolerance=0.05)):
        assert {g.status for g in fidelity.judge(cfg, good)} == {"PASS"}
        for bad in (replace(good, mean_kld=math.nan), replace(good, top1=math.nan)):
            statuses = {g.name: g.status for g in fidelity.judge(cfg, bad)}
            assert "FAIL" in statuses.values(), (cfg, statuses)
        short = replace(good, positions=good.panel_positions - 1)
        assert {g.status for g in fidelity.judge(cfg, short)} == {"FAIL"}
    with pytest.raises(fidelity.PinwheelError, match="NaN"):  # never summarized as a number
        fidelity.summarize(np.array([0.1, math.nan]), np.ones(2, bool), True, panel=panel,
                           teacher=teacher, top_k=-1, resamples=100, seed=0)  # fmt: skip


def test_the_tolerance_widens_a_non_strict_gate_by_exactly_its_margin(tmp_path):
    panel, teacher, student, *_ = _case(tmp_path, top_k=-1, teacher_k=-1)
    kld, agree, full, _ = fidelity.score_positions(teacher, student)
    r = fidelity.summarize(kld, agree, full, panel=panel, teacher=teacher, top_k=-1,
                           resamples=100, seed=0)  # fmt: skip
    cfg = _cfg(max_mean_kld=0.01, min_top1=0.8, tolerance=0.05)
    bound = 0.01 * (1 + 0.05)

    def statuses(mean, top1):
        return [g.status for g in fidelity.judge(cfg, replace(r, mean_kld=mean, top1=top1))]

    assert statuses(bound, 0.8 * 0.95) == ["PASS", "PASS"]
    assert statuses(math.nextafter(bound, 1.0), 0.99) == ["FAIL", "PASS"]
    assert statuses(0.0106, 0.7599) == ["FAIL", "FAIL"]  # 6% over, 5% margin: a FAIL
    gate = fidelity.judge(cfg, replace(r, mean_kld=0.001, top1=0.9))[0]
    assert gate.threshold.startswith("<= 0.0105") and gate.limit == bound and gate.op == "<="
