"""The signed stat memo of a locked venv's check (pinwheel.compile.venvmemo): a venv that
has not changed since its last passing check is not hashed again; anything that changed,
a memo edited, signed with another key or planted as a link, and the full check runs.

Real venvs (``python -m venv``) with a real wheel installed by pip from the committed
lock's hashes, as tests/test_locks.py makes them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from pathlib import Path

import pytest

from pinwheel import keyfile
from pinwheel.compile import lockedvenv, venvmemo
from pinwheel.compile.phases import Note

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = "hashing the venv's files"


@pytest.fixture(autouse=True)
def _no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The venv is made a moment before it is checked: its entries' ctimes are inside the
    2 s racy window, so the default would write no memo until a later check (tested on its
    own below). Entries changed by a test are changed after the memo, well apart."""
    monkeypatch.setattr(venvmemo, "RACY_NS", 0)


def _locked(tmp_path: Path) -> lockedvenv.LockedVenv:
    blocks = re.split(r"\n(?=[a-z])", (ROOT / "locks" / "cmake-build.txt").read_text())
    lock = tmp_path / "lock.txt"
    lock.write_text("\n".join(b for b in blocks if b.startswith("packaging==")) + "\n")
    return lockedvenv.ensure(lockedvenv.LockedVenvRequest(
        lock=lock, lock_name="locks/test.txt", interpreter=sys.executable,
        cache=tmp_path / "c", environ=dict(os.environ), kind="test-build"))  # fmt: skip


def _site(venv: lockedvenv.LockedVenv) -> Path:
    (site,) = venv.python.parent.parent.glob("lib/python3*/site-packages")
    return site


def _check(venv: lockedvenv.LockedVenv) -> Note:
    note = Note()
    lockedvenv.checked(venv, "test", note)
    return note


def _refused(venv: lockedvenv.LockedVenv, match: str) -> Note:
    note = Note()
    with pytest.raises(lockedvenv.LockedVenvError, match=match):
        lockedvenv.checked(venv, "test", note)
    return note


def _memo(venv: lockedvenv.LockedVenv) -> Path:
    assert venv.cache is not None
    return venvmemo.path(venvmemo.Scope(venv.cache, venv.lock_sha256), venv.python.parent.parent)


def _hashed(note: Note) -> bool:
    return any(d.startswith("hashed ") for d in note.did_) and not any(
        SKIPPED in s for s in note.skipped
    )


def test_an_unchanged_venv_is_not_hashed_again_and_still_passes(tmp_path: Path) -> None:
    venv = _locked(tmp_path)
    first = _check(venv)
    assert _hashed(first) and "recorded the venv's stat in a signed memo" in first.did_
    assert "no memo of an earlier check" in first.did_[0]
    second = _check(venv)
    assert not second.did_ and any(SKIPPED in s for s in second.skipped)
    record = lockedvenv.checked(venv, "test")
    assert [p["name"] for p in record["packages"] if p["from"] == "lock"] == ["packaging"]


def test_a_fresh_venv_is_not_memoised_inside_the_racy_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _locked(tmp_path)
    monkeypatch.setattr(venvmemo, "RACY_NS", 10**18)  # every entry "just changed"
    assert _hashed(_check(venv))
    assert venv.cache is not None and not (venv.cache / "memo" / "venv").exists()
    assert _hashed(_check(venv))


def test_a_file_edited_in_place_with_its_size_and_mtime_restored_is_caught(
    tmp_path: Path,
) -> None:
    venv = _locked(tmp_path)
    _check(venv)
    target = _site(venv) / "packaging" / "version.py"
    before = target.stat()
    data = target.read_bytes()
    at = data.index(b"def ")
    target.write_bytes(data[:at] + b"dEf " + data[at + 4:])  # same size, other bytes
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)  # fmt: skip
    assert after.st_ctime_ns != before.st_ctime_ns  # utime cannot set ctime back
    note = _refused(venv, "packaging/version.py differs from its RECORD")
    assert _hashed(note) and "added, removed or changed since its last check" in note.did_[0]


def test_a_pth_added_after_the_memo_is_refused(tmp_path: Path) -> None:
    venv = _locked(tmp_path)
    _check(venv)
    assert not _hashed(_check(venv))  # the memo holds
    (_site(venv) / "evil.pth").write_text("import os\n")
    note = _refused(venv, r"evil\.pth in .* is not in the lock")
    assert _hashed(note) and "added, removed or changed since its last check" in note.did_[0]


def test_an_edited_memo_or_one_signed_with_another_key_is_ignored(tmp_path: Path) -> None:
    venv = _locked(tmp_path)
    _check(venv)
    memo = _memo(venv)
    good = memo.read_bytes()
    at = good.index(b'"lock_sha256": "') + len(b'"lock_sha256": "')
    flipped = b"0" if good[at:at + 1] != b"0" else b"1"
    memo.write_bytes(good[:at] + flipped + good[at + 1:])  # one byte
    note = _check(venv)
    assert _hashed(note) and "not signed with this cache's key" in note.did_[0]
    assert not _hashed(_check(venv))  # the full check wrote a good memo again

    # An attacker who can write the venv and the cache, but not read the key: edits a
    # locked file and signs a memo of the edited venv with a key of their own.
    assert venv.cache is not None
    target = _site(venv) / "packaging" / "version.py"
    target.write_text(target.read_text() + "\nBACKDOOR = 1\n")
    scope = venvmemo.Scope(venv.cache, venv.lock_sha256)
    snap = venvmemo.snapshot(venv.python.parent.parent, _site(venv))
    assert snap is not None
    body = json.loads(memo.read_text())
    body.pop("signature")
    body.update(sha256=snap.sha256, entries=snap.entries, newest_ctime_ns=0)
    theirs = secrets.token_hex(32).encode()
    body["signature"] = keyfile.sign(theirs, "pinwheel venv memo",
                                     json.dumps(body, sort_keys=True,
                                                separators=(",", ":")).encode())  # fmt: skip
    memo.write_text(json.dumps(body))
    assert venvmemo.load(scope, venv.python.parent.parent)[0] is None
    note = _refused(venv, "packaging/version.py differs from its RECORD")
    assert _hashed(note) and "not signed with this cache's key" in note.did_[0]


def test_a_signed_memo_of_another_venv_or_lock_is_ignored(tmp_path: Path) -> None:
    """A memo this cache's key signed, copied to where another venv's (or another lock's)
    memo lives: it holds for the venv it names only."""
    venv = _locked(tmp_path)
    _check(venv)
    assert venv.cache is not None
    root = venv.python.parent.parent
    other = venvmemo.Scope(venv.cache, "0" * 64)
    planted = venvmemo.path(other, root)
    planted.write_bytes(_memo(venv).read_bytes())
    got, why = venvmemo.load(other, root)
    assert got is None and "another venv or lock" in why
    assert venvmemo.load(venvmemo.Scope(venv.cache, venv.lock_sha256), root)[0] is not None


def test_a_memo_planted_as_a_link_is_not_followed(tmp_path: Path) -> None:
    venv = _locked(tmp_path)
    _check(venv)
    memo = _memo(venv)
    elsewhere = tmp_path / "elsewhere.json"
    signed = memo.read_bytes()  # a memo this cache's key did sign
    elsewhere.write_bytes(signed)
    memo.unlink()
    memo.symlink_to(elsewhere)
    note = _check(venv)
    assert _hashed(note) and "unreadable" in note.did_[0]
    assert not memo.is_symlink()  # the full check's memo replaced the link, not wrote through
    assert elsewhere.read_bytes() == signed and not elsewhere.samefile(memo)
    assert not _hashed(_check(venv))

    # the memo folder itself a link: never gone through
    folder = memo.parent
    moved = tmp_path / "moved"
    folder.rename(moved)
    folder.symlink_to(moved)
    note = _check(venv)
    assert _hashed(note)
