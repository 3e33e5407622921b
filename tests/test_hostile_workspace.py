"""A kept workspace's records (docs/SECURITY.md, "Cache contents"): the export listing
(``export.json``), the key stamp and ``last-build.json`` are read bounded and as regular
files (a FIFO planted there never hangs a build), never through a link, and the wheel a
last-build record names stays inside the workspace. Real files, FIFOs and links."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from pinwheel.compile import workspace


def _wheel(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x/__init__.py", "")
    return path


@pytest.mark.timeout(120)
def test_an_export_listing_that_is_a_fifo_never_hangs_the_export(tmp_path: Path) -> None:
    """The export's stamp holds (same tree, every file as recorded) but its listing
    (``export.json``) is a FIFO: no export is held (a full sync follows), nothing waits."""
    listing = tmp_path / "export.json"
    dest = tmp_path / "src"
    of = {"tree": "ab" * 20, "exclude": []}
    synced = workspace.sync(dest, [workspace.Entry("a.txt", b"a\n")], listing)
    workspace._stamp_export(dest, listing, of, synced.digest)
    assert workspace.held_export(dest, listing, of) is not None  # the stamp holds
    listing.unlink()
    os.mkfifo(listing)
    assert workspace.held_export(dest, listing, of) is None  # never opened for reading
    again = workspace.sync(dest, [workspace.Entry("a.txt", b"a\n")], listing)
    assert again.kept == 1 and json.loads(listing.read_text()) == ["a.txt"]


@pytest.mark.timeout(120)
def test_a_last_build_record_or_key_stamp_that_is_a_fifo_is_no_record(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    os.mkfifo(root / workspace.LAST)
    assert workspace.last_build(root, "inputs") is None
    os.mkfifo(root / workspace.STAMP)
    assert workspace.prepare(root, "key", cold=False) is False


def test_a_last_build_record_naming_a_wheel_outside_the_workspace_is_refused(
    tmp_path: Path,
) -> None:
    """``"wheel": "../../elsewhere/x.whl"`` (with that file's true sha256) is no record, and
    so is a wheel reached through a folder planted as a link out."""
    root = tmp_path / "cache" / "build" / "engine"
    root.mkdir(parents=True)
    outside = _wheel(tmp_path / "elsewhere" / "x-1.0-py3-none-any.whl")
    sha = hashlib.sha256(outside.read_bytes()).hexdigest()

    def record(rel: str) -> None:
        doc = {"inputs": "i", "wheel": rel, "sha256": sha, "stamp": None, "record": {}}
        (root / workspace.LAST).write_text(json.dumps(doc))

    record(os.path.relpath(outside, root))
    assert workspace.last_build(root, "i") is None
    record(str(outside))
    assert workspace.last_build(root, "i") is None
    (root / "dist").symlink_to(outside.parent)
    record("dist/x-1.0-py3-none-any.whl")
    assert workspace.last_build(root, "i") is None
    # The same record of a wheel inside: the build's.
    (root / "dist").unlink()
    inside = _wheel(root / "dist" / "x-1.0-py3-none-any.whl")
    assert inside.read_bytes() == outside.read_bytes()
    got = workspace.last_build(root, "i")
    assert got is not None and got.wheel == inside
