"""The derivation record: one digest for every compile key, and "rebuilt because" from a diff.

Real files: a workspace folder prepared, stamped and read back as a later build would.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from pinwheel.compile import workspace
from pinwheel.compile.derivation import Derivation, because, changed, digest

IDENTITY = {
    "builder": "cmake",
    "nvcc": ["12.4.131", "ab" * 32],
    "env": {"CUDAFLAGS": "-O3", "PATH": "/usr/bin"},
}


def test_the_one_digest_is_the_spelling_every_key_used_before() -> None:
    # Keys recorded by earlier builds (kept workspaces, store entries) must still match.
    record = {"identity": IDENTITY, "canonical": {"method": "namespace"}}
    legacy = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    assert digest(record) == legacy
    assert Derivation.of("selftest", **record).key == legacy


def test_changed_names_each_differing_field_by_its_dotted_path() -> None:
    old = {"identity": IDENTITY, "canonical": {"method": "namespace"}}
    new = json.loads(json.dumps(old))
    new["identity"]["nvcc"] = ["12.8.93", "cd" * 32]
    new["identity"]["env"]["CUDAFLAGS"] = "-O2"
    new["identity"]["env"]["NEW"] = "1"
    assert changed(old, new) == ["identity.env.CUDAFLAGS", "identity.env.NEW", "identity.nvcc"]
    assert changed(old, old) == []
    assert changed([1], [2]) == ["(the whole record)"]
    line = because([f"f{i}" for i in range(10)])
    assert line.startswith("rebuilt because: f0, f1") and "and 2 more changed" in line


def _derivation(**changes: object) -> Derivation:
    ident = {**IDENTITY, **changes}
    return Derivation.of("selftest", identity=ident, canonical={"method": "namespace"})


def test_a_kept_workspace_says_which_field_made_the_rebuild(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = _derivation()
    assert workspace.rebuild_reason(work, first, cold=False) == (
        "rebuilt because: no earlier build in this workspace"
    )
    assert workspace.prepare(work, first, cold=False) is False
    assert workspace.rebuild_reason(work, first, cold=False) is None
    assert workspace.prepare(work, first, cold=False) is True

    second = _derivation(builder="setuptools")
    assert workspace.rebuild_reason(work, second, cold=False) == (
        "rebuilt because: identity.builder changed"
    )
    assert workspace.prepare(work, second, cold=False) is False
    assert "cold build" in (workspace.rebuild_reason(work, second, cold=True) or "")


def test_a_stamp_from_an_older_pinwheel_or_a_hostile_one_is_a_rebuild_not_a_hang(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    stamp = work / workspace.STAMP
    stamp.write_text(json.dumps({"key": "0" * 64}))
    assert "recorded no derivation" in (
        workspace.rebuild_reason(work, _derivation(), cold=False) or ""
    )
    stamp.unlink()
    os.mkfifo(stamp)  # read bounded, as a regular file only: a FIFO is no stamp
    assert workspace.rebuild_reason(work, _derivation(), cold=False) == (
        "rebuilt because: no earlier build in this workspace"
    )
    assert workspace.prepare(work, _derivation(), cold=False) is False


@pytest.mark.parametrize("text", ["[1, 2]", '{"key": 5}', "not json", "\x00" * 10])
def test_a_malformed_stamp_keeps_nothing(tmp_path: Path, text: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / workspace.STAMP).write_text(text)
    (work / "object.o").write_text("from an earlier build")
    assert workspace.prepare(work, _derivation(), cold=False) is False
    assert not (work / "object.o").exists()
