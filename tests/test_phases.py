"""The no-change path says, per phase, what it did and skipped; file stamps answer for
bytes nothing touched and fall back to hashing for anything else. Real builds of the
tiny engine-shaped project (tinyproject.py, stand-in device code), real files."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.compile import stamps
from pinwheel.compile.checkmemo import Memo
from pinwheel.compile.phases import Phases
from pinwheel.compile.pipeline import build as run_build
from pinwheel.manifest import load
from test_build import WHEEL, Tiny, request, tiny  # noqa: F401  (fixture)


def _phase(outcome, name):
    (row,) = [p for p in outcome.phases if p.name == name]
    return row


def _rebuild(project: Tiny, manifest: Path, out: str):
    result = project.replay(manifest)
    req = dataclasses.replace(
        request(project, manifest, project.tmp / out, result), engine_workdir=None
    )
    return run_build(req)


def test_a_no_change_rebuild_skips_each_phase_it_may_and_says_so(tiny: Tiny) -> None:  # noqa: F811
    manifest = tiny.manifest()
    first = _rebuild(tiny, manifest, "w1")
    assert not _phase(first, "builder").skipped  # cold: the builder ran
    assert _phase(first, "check").did and not _phase(first, "check").skipped
    second = _rebuild(tiny, manifest, "w2")
    assert second.wheels.wheels == first.wheels.wheels  # the same sha256
    builder = _phase(second, "builder")
    assert not builder.did
    assert "confirmed by stamp" in builder.skipped[0]
    check = _phase(second, "check")
    assert not check.did  # neither auditwheel's tag analysis nor the check ran again
    assert any(s.startswith("tag of ") for s in check.skipped)
    assert any(s.startswith("check of ") for s in check.skipped)
    assert any(s.startswith("member digests of ") for s in check.skipped)
    # the looked-up member digests are the wheel's own
    from pinwheel.wheels.provenance import member_digests

    (engine,) = [c for c in second.wheels.components if c.kind == "engine"]
    published = second.wheels.out_dir / second.wheels.built[0].name
    recorded = json.loads(second.wheels.provenance.read_text())["components"]
    assert [c["members"] for c in recorded if c["kind"] == "engine"] == [
        member_digests(published)]  # fmt: skip
    assert _phase(second, "build sources").skipped
    export = _phase(second, "export")
    assert "0 file(s) written" in export.did[0]
    # --json carries the table; the human output prints it
    doc = second.to_json()["phases"]
    assert [p["name"] for p in doc] == [p.name for p in second.phases]
    assert any(line.startswith("phases:") for line in second.human_lines())
    # a cold build (--no-cache) looks nothing up: tag and check run
    cold = run_build(dataclasses.replace(
        request(tiny, manifest, tiny.tmp / "w3", tiny.replay(manifest)),
        engine_workdir=None, compiler_cache=False))  # fmt: skip
    assert cold.wheels.wheels == first.wheels.wheels
    assert _phase(cold, "check").did and not _phase(cold, "check").skipped


def test_a_wheel_rewritten_behind_its_stamp_is_hashed_not_trusted(tiny: Tiny) -> None:  # noqa: F811
    """Same size, same mtime, other bytes: only ctime tells. The stamp must fall back to
    hashing: the tampered wheel is not handed back as the build (a blindly trusted stamp
    would), and the wheels hold the cold build's bytes."""
    manifest = tiny.manifest()
    first = _rebuild(tiny, manifest, "w1")
    work = tiny.tmp / "cache" / "build" / load(manifest).name
    last = json.loads((work / "last-build.json").read_text())
    wheel = work / last["wheel"]
    before = wheel.stat()
    data = bytearray(wheel.read_bytes())
    data[-30] ^= 0xFF  # inside the zip's end records: a different sha256, same size
    with open(wheel, "r+b") as fh:  # in place: same inode
        fh.write(bytes(data))
    os.utime(wheel, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert wheel.stat().st_size == before.st_size
    assert wheel.stat().st_mtime_ns == before.st_mtime_ns
    second = _rebuild(tiny, manifest, "w2")
    builder = _phase(second, "builder")
    # The stamp did not hold: the last wheel is not handed back (a build, or the object
    # store's copy of the cold build, takes its place).
    assert not any("its wheel is the build" in s for s in builder.skipped), builder
    assert builder.did or "the object store holds this build" in builder.skipped[0]
    assert second.wheels.wheels == first.wheels.wheels


def test_stamp_falls_back_on_any_difference(tmp_path: Path) -> None:
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 100)
    stamp = stamps.take(f)
    assert stamp is not None
    got = stamps.sha256_of(f, stamp)
    assert got.by_stamp and got.sha256 == stamp.sha256
    st = f.stat()
    f.write_bytes(b"y" * 100)  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: ctime still tells
    got = stamps.sha256_of(f, stamp)
    assert not got.by_stamp and "ctime" in got.how
    assert got.sha256 != stamp.sha256
    assert got.stamp is not None and got.stamp.sha256 == got.sha256
    replaced = tmp_path / "b.bin"
    replaced.write_bytes(f.read_bytes())
    os.replace(replaced, f)  # a new inode
    assert not stamps.sha256_of(f, got.stamp).by_stamp


def test_hostile_stamps_and_files_are_hashed_or_refused(tmp_path: Path) -> None:
    good = {"sha256": "0" * 64, "size": 1, "mtime_ns": 1, "ctime_ns": 1, "inode": 1, "device": 1}
    assert stamps.Stamp.from_json(good) is not None
    for bad in (
        None, [], "x", {**good, "sha256": "0" * 63}, {**good, "sha256": "G" * 64},
        {**good, "size": True}, {**good, "inode": 1 << 70}, {**good, "mtime_ns": -1},
        {**good, "device": "1"}, {**good, "ctime_ns": 1.0}, {**good, "sha256": "0" * 64 + "\n"},
        {k: v for k, v in good.items() if k != "inode"},
    ):  # fmt: skip
        assert stamps.Stamp.from_json(bad) is None, bad
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = stamps.sha256_of(fifo, None)  # never opened: a FIFO would block a reader
    assert got.sha256 is None and got.how == "not a regular file"
    target = tmp_path / "t"
    target.write_bytes(b"t")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert stamps.sha256_of(link, stamps.take(target)).sha256 is None
    assert stamps.sha256_of(tmp_path / "missing", None).sha256 is None


def test_a_hostile_memo_is_a_miss(tmp_path: Path) -> None:
    """Memo records that are not JSON, too deep, a FIFO, or of another shape: the work
    is done again (here: the wheel is hashed), never an error, never trusted."""
    memo = Memo(tmp_path / "memo")
    f = tmp_path / "w.whl"
    f.write_bytes(b"wheel")
    first = memo.sha(f)
    assert not first.by_stamp
    assert memo.sha(f).by_stamp  # recorded: the stamp answers now
    (record,) = (tmp_path / "memo" / "stamp").iterdir()
    for text in ("{", "[" * 200 + "]" * 200, json.dumps({"format": 1, "stamp": [1]}),
                 json.dumps({"format": 2, "stamp": first.stamp.to_json()})):  # fmt: skip
        record.write_text(text)
        assert not memo.sha(f).by_stamp
        record.unlink(missing_ok=True)
    os.mkfifo(record)
    assert memo.sha(f).sha256 == first.sha256  # the FIFO is not read (no hang)


def test_a_hostile_member_digest_memo_is_a_miss(tmp_path: Path) -> None:
    """A member-digest record that is not the wheel's own shape (control characters, a
    non-hex digest, a FIFO, a link): the members are read from the wheel again."""
    import zipfile

    from pinwheel.wheels.provenance import member_digests

    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("w/__init__.py", "x = 1\n")
    sha = "c" * 64
    memo = Memo(tmp_path / "memo")
    truth = member_digests(wheel)
    assert memo.members(wheel, sha) == truth
    record = tmp_path / "memo" / "members" / f"{sha}.json"
    assert record.is_file()
    assert memo.members(wheel, sha) == truth and memo.note.skipped  # looked up
    for members in ({"w/__init__.py": "\x1b[2J" + "0" * 60}, {"w/__init__.py": "Z" * 64},
                    {"w/__init__.py": 7}, {}):  # fmt: skip
        record.write_text(json.dumps({"format": 1, "members": members}))
        assert memo.members(wheel, sha) == truth, members
    record.unlink()
    os.mkfifo(record)
    assert memo.members(wheel, sha) == truth  # the FIFO is not read (no hang)
    assert memo.members(wheel, "../../x") == truth  # no such key is looked up or written
    assert not (tmp_path / "x.json").exists()


def test_the_cli_prints_and_emits_the_phase_table(tiny: Tiny) -> None:  # noqa: F811
    from gitfixture import UPSTREAM_URL

    manifest = tiny.manifest()
    cmd = [sys.executable, "-m", "pinwheel", "--manifest", str(manifest), "--cache",
           str(tiny.tmp / "cache"), "--mirror", f"{UPSTREAM_URL}={tiny.up.bare}",
           "--json", "build", "--out", str(tiny.tmp / "wheels")]  # fmt: skip
    env = {**os.environ, "PINWHEEL_NO_CUDA": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tiny.tmp)
    if proc.returncode != 0 and "CUDA" in proc.stderr + proc.stdout:
        pytest.skip("the CLI build resolves a CUDA toolkit; covered by test_build_cuda")
    assert proc.returncode == 0, proc.stderr
    names = [p["name"] for p in json.loads(proc.stdout)["phases"]]
    assert names[:2] == ["reach upstreams", "replay"] and "check" in names


def test_phases_collect_in_order() -> None:
    phases = Phases()
    with phases.phase("a") as note:
        note.skip("nothing to do")
    running = phases.start("b")
    running.note.did("work")
    running.end()
    rows = phases.rows()
    assert [(r.name, r.did, r.skipped) for r in rows] == [
        ("a", (), ("nothing to do",)), ("b", ("work",), ())
    ]  # fmt: skip
