"""The in-process scorer's pinwheel side, without a server: teacher store, records, receipts.

Real files throughout: a streamed full-row teacher file (the same bytes as the in-memory
writer's), read back by the worker extension's memory-mapped store and by pinwheel's
index; hostile teacher files (a wrong sha256, a compressed member, a truncated member,
a FIFO); hostile RPC answers (wrong sizes, not base64, NaN and negative values, huge
numbers); the manifest's new keys. (`qualify verify-receipt`: tests/test_receipt_verify.py.)
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pinwheel.errors import PinwheelError, UsageError, VerifyError
from pinwheel.manifest import model as manifest
from pinwheel.serve import coldstarts, fidelity, inprocess
from pinwheel.serve.workers import detkl, kld_ext

FIXTURE = Path(__file__).parent / "fixtures" / "qualify-fidelity-cpu.toml"


def _teacher(tmp: Path, p: int = 7, v: int = 50, seed: int = 0) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(seed)
    full = rng.normal(0, 2, (p, v)).astype(np.float32)
    full -= np.log(np.exp(full.astype(np.float64)).sum(axis=1, keepdims=True)).astype(np.float32)
    arrays = {
        "offsets": np.array([0, 3, p], np.int64),
        "target": rng.integers(0, v, p).astype(np.int32),
        "target_logprob": np.zeros(p, np.float32),
    }
    meta = {"schema": fidelity.TEACHER_SCHEMA, "panel_sha256": "0" * 64, "source": "test",
            "top_k": -1}  # fmt: skip
    np.save(tmp / "full.npy", full)
    out = tmp / "teacher.npz"
    fidelity.write_teacher_file(out, arrays, meta, tmp / "full.npy")
    assert out.read_bytes() == fidelity.teacher_bytes(arrays | {"full": full}, meta)
    return out, full


def test_streamed_teacher_is_read_in_place_by_the_engine_and_indexed_by_pinwheel(tmp_path):
    path, full = _teacher(tmp_path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    store = kld_ext.TeacherStore(str(path), sha)
    assert isinstance(store.full, np.memmap) and np.array_equal(store.full, full)
    assert (store.positions, store.vocab) == (7, 50)
    ix = fidelity.read_index(path, sha)
    assert (ix.positions, ix.vocab, ix.sha256) == (7, 50, sha)
    with pytest.raises(ValueError, match="sha256"):
        kld_ext.TeacherStore(str(path), "f" * 64)
    with pytest.raises(VerifyError, match="pins"):
        fidelity.read_index(path, "f" * 64)


def test_hostile_teacher_files_are_refused(tmp_path):
    path, _ = _teacher(tmp_path)
    data = path.read_bytes()
    # a compressed member: could unpack to any size
    bad = tmp_path / "deflated.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    with pytest.raises(UsageError, match="compressed"):
        fidelity.read_index(bad, None)
    with pytest.raises(ValueError, match="compressed"):
        kld_ext.TeacherStore(str(bad), hashlib.sha256(bad.read_bytes()).hexdigest())
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError):
        fidelity.read_index(cut, None)
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="no teacher file"):
        fidelity.read_index(fifo, None)  # not a regular file: never opened (would block)
    # a header that declares more rows than the member holds (an .npz bomb)
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 50), }"
    with zipfile.ZipFile(path) as src:
        members = {i.filename: src.read(i) for i in src.infolist()}
    npy = members["full.npy"]
    hlen = int.from_bytes(npy[8:10], "little")
    bomb_hdr = header.ljust(hlen - 1) + b"\n"
    members["full.npy"] = npy[:10] + bomb_hdr + npy[10 + hlen :]
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w") as dst:
        for name, body in members.items():
            dst.writestr(name, body)
    with pytest.raises(UsageError):
        fidelity.read_index(bomb, None)


def _answer(rec: np.ndarray, **over) -> dict:
    return {
        "errors": [],
        "scored": len(rec),
        "records": base64.b64encode(rec.tobytes()).decode(),
    } | over


def test_records_from_the_engine_are_checked():
    rec = np.zeros(3, detkl.RECORD)
    rec["kl"] = [0.1, 0.0, 2.5]
    rec["flags"] = [1, 3, 0]
    rec["top1"] = [5, 7, 9]
    got = inprocess.decode_records(_answer(rec), 3, "srv")
    assert got.tobytes() == rec.tobytes() and detkl.RECORD.itemsize == inprocess.RECORD_BYTES
    for over, why in (
        ({"records": "!!!"}, "base64"),
        ({"records": base64.b64encode(rec.tobytes()[:-1]).decode()}, "bytes"),
        ({"records": "A" * 10**6}, "size"),
        ({"errors": "x"}, "errors"),
        ({"errors": ["window 3: the prompt's tokens are not the teacher's"]}, "could not score"),
        ({"scored": 2}, "scored 2 of 3"),
        ({"scored": 10**40}, "scored"),
    ):
        with pytest.raises(PinwheelError, match=why):
            inprocess.decode_records(_answer(rec, **over), 3, "srv")
    for kl in (float("nan"), -1.0):
        bad = rec.copy()
        bad["kl"][1] = kl
        with pytest.raises(PinwheelError, match="NaN or negative"):
            inprocess.decode_records(_answer(bad), 3, "srv")


def test_the_extension_package_is_self_contained(tmp_path):
    d = inprocess.engine_package(tmp_path / "ext")
    names = sorted(p.name for p in (d / inprocess.PACKAGE).iterdir())
    assert names == ["__init__.py", "detkl.py", "kld_ext.py"]
    for f in (d / inprocess.PACKAGE).glob("*.py"):
        assert "import pinwheel" not in f.read_text() and "from pinwheel" not in f.read_text()
    flags, env = inprocess.server_additions(d, "/x")
    assert flags == ("--worker-extension-cls", "pinwheel_kld.kld_ext.KldExtension")
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["PYTHONPATH"] == f"{d}:/x"


def test_manifest_keys_scorer_cold_starts_and_tolerance_source(tmp_path):
    base = FIXTURE.read_text()

    def load(extra: str, top: str = "top_k = 20"):
        p = tmp_path / "m.toml"
        p.write_text(base.replace("top_k = 20", top + "\n" + extra))
        return manifest.load(p).require("qualify").fidelity

    f = load('scorer = "in-process"\ncold_starts = 5', "top_k = -1")
    assert f.scorer == "in-process" and f.cold_starts == 5
    # a cold-start check needs at least 2 starts: the default is 2, and 1 is refused
    assert load("").scorer == "rows" and load("").cold_starts == 2
    assert load("").protocol == "hash" and load('protocol = "mean"').protocol == "mean"
    for extra, top in (('scorer = "in-process"', "top_k = 20"), ('scorer = "gpu"', "top_k = -1"),
                       ("cold_starts = 0", "top_k = -1"), ("cold_starts = 10000", "top_k = -1"),
                       ("cold_starts = 1", "top_k = -1"), ('protocol = "vote"', "top_k = -1"),
                       ("tolerance = 0.9", "top_k = -1")):  # fmt: skip
        with pytest.raises(PinwheelError):
            load(extra, top)
    assert load('tolerance = 0.05\ntolerance_source = "default"').tolerance == 0.05


def test_cold_start_gate_needs_one_hash_over_every_start():
    def run(i: int, h: str) -> coldstarts.ColdRun:
        return coldstarts.ColdRun(i, 1.0, h, h, 0.1, 1.0, 10, "in-process")

    two = coldstarts.Protocol("hash", 2)
    assert coldstarts.judge((run(1, "a"), run(2, "a")), two).status == "PASS"
    assert coldstarts.judge((run(1, "a"), run(2, "b")), two).status == "FAIL"
    assert coldstarts.judge((run(1, "a"),), two).status == "FAIL"
    # one start shows nothing about cold starts: never "hash equal across 1 cold starts: PASS"
    one = coldstarts.judge((run(1, "a"),), coldstarts.Protocol("hash", 1))
    assert one.status == "FAIL" and "not enough starts: 2 needed" in one.detail
    with pytest.raises(PinwheelError, match="not enough starts"):
        coldstarts.run(lambda i: None, lambda t: None, lambda t: 0.0, coldstarts.Protocol("hash", 1))
