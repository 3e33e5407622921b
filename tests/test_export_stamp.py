"""A no-change export reads nothing: the tree id names the bytes, file stamps say nobody
touched them (pinwheel.compile.workspace.sync_tree / held_export).

A real git repository is exported twice. The second export of the same tree is proved
to read nothing by handing it a repository path that does not exist: git would fail
there. Anything a stamp does not cover (an edit of the same size with its mtime reset,
a deleted or replaced file, another tree, another exclude) exports in full again; a
hostile stamp (FIFO, link, huge or non-ASCII numbers, control characters, a name
leading out) is no stamp.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import pygit2
import pytest

from pinwheel.compile import workspace
from pinwheel.errors import PinwheelError

FILES = {"a.c": "int a;\n", "sub/b.h": "#define B 1\n", "run.sh": "#!/bin/sh\n"}


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid",
           "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def _repo(root: Path, files: dict[str, str]) -> SimpleNamespace:
    """A real repository holding ``files``: what sync_tree reads of a replay result."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / ".git").exists():
        _git(root, "init", "-q")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    os.chmod(root / "run.sh", 0o755)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "x", "--allow-empty")
    head = _git(root, "rev-parse", "HEAD")
    return SimpleNamespace(repo_path=root / ".git", head=head, tree=_git(root, "rev-parse", "HEAD^{tree}"))


def _gone(result: SimpleNamespace, tmp: Path) -> SimpleNamespace:
    """The same tree id with no repository behind it: exporting it would fail."""
    return SimpleNamespace(repo_path=tmp / "no-such-repo", head=result.head, tree=result.tree)


def _reads(result: SimpleNamespace, work: Path, tmp: Path, **kw) -> bool:
    """Whether an export of ``result``'s tree id goes to the repository (it fails there:
    none is behind it) rather than answering from the stamp."""
    try:
        workspace.sync_tree(_gone(result, tmp), work / "src", work / "export.json", **kw)
    except (PinwheelError, pygit2.GitError):
        return True
    return False


@pytest.fixture
def exported(tmp_path: Path):
    result = _repo(tmp_path / "repo", FILES)
    work = tmp_path / "work"
    first = workspace.sync_tree(result, work / "src", work / "export.json")
    assert sorted(first.written) == sorted(FILES)
    return result, work, first


def test_the_same_tree_again_reads_and_writes_nothing(exported, tmp_path: Path) -> None:
    result, work, first = exported
    again = workspace.sync_tree(_gone(result, tmp_path), work / "src", work / "export.json")
    assert again == workspace.Synced((), (), len(FILES), first.digest)
    # The real repository gives the same answer and the same digest.
    assert workspace.sync_tree(result, work / "src", work / "export.json").digest == first.digest


def test_an_edit_of_the_same_size_with_its_mtime_reset_is_exported_again(exported, tmp_path):
    result, work, first = exported
    path = work / "src" / "a.c"
    path.write_text("int b;\n")  # same size
    os.utime(path, (workspace.SOURCE_MTIME, workspace.SOURCE_MTIME))
    assert _reads(result, work, tmp_path)  # the stamp does not hold: the tree is read
    synced = workspace.sync_tree(result, work / "src", work / "export.json")
    assert synced.written == ("a.c",) and synced.digest == first.digest
    assert path.read_text() == FILES["a.c"]


@pytest.mark.parametrize("how", ["deleted", "replaced", "chmod"])
def test_a_file_deleted_replaced_or_rechmodded_is_exported_again(exported, tmp_path, how):
    result, work, first = exported
    path = work / "src" / "sub" / "b.h"
    if how == "deleted":
        path.unlink()
    elif how == "replaced":  # same bytes, same times, another inode
        copy = path.with_name("copy")
        copy.write_bytes(path.read_bytes())
        os.utime(copy, (workspace.SOURCE_MTIME, workspace.SOURCE_MTIME))
        os.replace(copy, path)
    else:
        os.chmod(path, 0o600)
    assert _reads(result, work, tmp_path)  # the stamp does not hold: the tree is read
    assert workspace.sync_tree(result, work / "src", work / "export.json").digest == first.digest
    assert path.read_text() == FILES["sub/b.h"]


def test_another_tree_or_another_exclude_is_exported(exported, tmp_path: Path) -> None:
    result, work, first = exported
    assert _reads(result, work, tmp_path, exclude=("sub/**",))  # same tree, another exclude
    changed = _repo(tmp_path / "repo", {**FILES, "a.c": "int changed;\n"})
    synced = workspace.sync_tree(changed, work / "src", work / "export.json")
    assert synced.written == ("a.c",) and synced.digest != first.digest


def _stamp(work: Path) -> Path:
    return workspace.export_stamp(work / "export.json")


HOSTILE = {
    "huge inode": lambda d: d["files"]["a.c"].__setitem__(4, 10**400),
    "non-ASCII digits": lambda d: d["files"]["a.c"].__setitem__(1, "١٢"),
    "control characters": lambda d: d.__setitem__("digest", "ab\x1b[2J\x00"),
    "a name leading out": lambda d: d["files"].__setitem__("../../etc/passwd", [0] * 6),
    "not an object": lambda d: d.clear(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_stamp_is_no_stamp(exported, tmp_path: Path, name: str) -> None:
    result, work, first = exported
    doc = json.loads(_stamp(work).read_text())
    HOSTILE[name](doc)
    _stamp(work).write_text(json.dumps(doc) if doc else "[]")
    assert _reads(result, work, tmp_path)  # the stamp does not hold: the tree is read
    assert workspace.sync_tree(result, work / "src", work / "export.json").digest == first.digest


def test_a_stamp_that_is_a_fifo_or_a_link_is_not_followed(exported, tmp_path: Path) -> None:
    result, work, first = exported
    real = tmp_path / "elsewhere.json"
    real.write_bytes(_stamp(work).read_bytes())
    _stamp(work).unlink()
    _stamp(work).symlink_to(real)  # a valid stamp, but through a link
    assert _reads(result, work, tmp_path)  # the stamp does not hold: the tree is read
    workspace.sync_tree(result, work / "src", work / "export.json")
    _stamp(work).unlink()
    os.mkfifo(_stamp(work))  # a FIFO with no writer: opening it for reading would block
    done = threading.Event()

    def sync() -> None:
        if _reads(result, work, tmp_path):
            done.set()

    thread = threading.Thread(target=sync, daemon=True)
    thread.start()
    thread.join(30)
    assert done.is_set(), "a FIFO stamp was opened and blocked the export"


# --------------------------------------------------------------------------- adopt


def test_a_fresh_export_is_moved_into_place_with_syncs_modes_and_times(tmp_path: Path) -> None:
    staged, dest, listing = tmp_path / "staged", tmp_path / "work" / "deps" / "x", tmp_path / "x.json"
    (staged / "sub").mkdir(parents=True)
    (staged / "sub" / "a.h").write_text("a\n")
    (staged / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(staged / "sub" / "a.h", 0o664)  # git archive's tar.umask leaves group write
    os.chmod(staged / "run.sh", 0o775)
    (staged / "link.h").symlink_to("sub/a.h")
    synced = workspace.adopt(staged, dest, listing)
    assert not staged.exists() and synced.written == ("link.h", "run.sh", "sub/a.h")
    assert json.loads(listing.read_text()) == ["link.h", "run.sh", "sub/a.h"]
    assert (dest / "sub" / "a.h").stat().st_mode & 0o777 == 0o644
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o755
    for rel in synced.written:
        assert os.lstat(dest / rel).st_mtime_ns == workspace.SOURCE_MTIME * 10**9
    # what a later sync of the same files finds: nothing to write
    again = workspace.sync(dest, workspace.dir_entries(dest, skip=()), listing)
    assert again.written == () and again.kept == 3


@pytest.mark.parametrize("hostile", ["fifo", "link out"])
def test_adopt_refuses_a_fifo_or_a_link_leading_out_and_moves_nothing(tmp_path, hostile) -> None:
    from pinwheel import confine

    staged, dest = tmp_path / "staged", tmp_path / "dest"
    staged.mkdir()
    (staged / "ok.h").write_text("ok\n")
    if hostile == "fifo":
        os.mkfifo(staged / "pipe")
    else:
        (staged / "out").symlink_to(tmp_path / "outside")
    with pytest.raises(confine.Escape):
        workspace.adopt(staged, dest, tmp_path / "listing.json")
    assert staged.is_dir() and not dest.exists() and not (tmp_path / "listing.json").exists()
    with pytest.raises(FileExistsError):  # never over an existing export
        dest.mkdir()
        workspace.adopt(staged, dest, tmp_path / "listing.json")
