"""Boundary: build-source trees, replayed trees, kept workspaces (docs/SECURITY.md, "trees").

A tree pinwheel exports, keeps or materialises is judged by *resolved* path, not by the
text of its links: every link is followed step by step against the tree's root
(:func:`pinwheel.confine.resolve`) and every write or delete opens each folder on the way
with ``O_NOFOLLOW`` (``confine.*_beneath``). Real git repositories, real tar archives from
``tarfile`` and ``git archive``, real files; nothing is mocked.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gitfixture import Upstream
from pinwheel import archive, confine
from pinwheel.compile import workspace
from pinwheel.errors import PinwheelError


def tar_of(*members: tuple[str, str | bytes]) -> bytes:
    """An uncompressed tar: (name, bytes) is a file, (name, "-> target") a symlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body in members:
            info = tarfile.TarInfo(name)
            if isinstance(body, str) and body.startswith("-> "):
                info.type = tarfile.SYMTYPE
                info.linkname = body[3:]
                tar.addfile(info)
            else:
                data = body.encode() if isinstance(body, str) else body
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.mkdir()
    (path / "evil.txt").write_text("the victim's own file\n")
    return path


# --------------------------------------------------------------------------- the examples


def test_workspace_tar_link_then_file_never_writes_outside(tmp_path: Path, victim: Path) -> None:
    """Issue 34: `tiny/data -> /victim`, then a file `tiny/data/evil.txt` on the next build,
    wrote /victim/evil.txt (workspace.tar_entries was its own tar reader)."""
    (victim / "evil.txt").unlink()
    dest, listing = tmp_path / "ws" / "src", tmp_path / "ws" / "export.json"
    first = tar_of(("src/tiny/__init__.py", "x = 1\n"), ("src/tiny/data", f"-> {victim}"))
    second = tar_of(("src/tiny/__init__.py", "x = 1\n"), ("src/tiny/data/evil.txt", "pwned\n"))
    with pytest.raises(PinwheelError, match="absolute"):
        workspace.sync(dest, workspace.tar_entries(first), listing)
    workspace.sync(dest, workspace.tar_entries(second), listing)
    assert not (victim / "evil.txt").exists()
    assert (dest / "tiny" / "data" / "evil.txt").read_text() == "pwned\n"


def test_workspace_tar_file_then_link_never_deletes_outside(tmp_path: Path, victim: Path) -> None:
    """Issue 34, reverse order: the file first, the link on the next build; removing the
    dropped file went through the link and deleted /victim/evil.txt."""
    dest, listing = tmp_path / "ws" / "src", tmp_path / "ws" / "export.json"
    first = tar_of(("src/tiny/data/evil.txt", "ours\n"))
    second = tar_of(("src/tiny/data", f"-> {victim}"))
    workspace.sync(dest, workspace.tar_entries(first), listing)
    with pytest.raises(PinwheelError, match="absolute"):
        workspace.sync(dest, workspace.tar_entries(second), listing)
    assert (victim / "evil.txt").read_text() == "the victim's own file\n"


def test_workspace_tar_refuses_a_member_under_a_link_in_one_tree(tmp_path: Path) -> None:
    """Within one tree: a link, then a member under its name (written through the link)."""
    raw = tar_of(("src/d", "-> sub"), ("src/sub/x", "1"), ("src/d/evil.txt", "2"))
    with pytest.raises(archive.ArchiveError, match="under the link"):
        list(workspace.tar_entries(raw))


def test_sync_never_writes_or_deletes_through_a_link_planted_in_the_workspace(
    tmp_path: Path, victim: Path
) -> None:
    """Second fence: whatever the entries, sync's writes and deletes open every folder on
    the way O_NOFOLLOW, so a link already in the workspace leads nothing out."""
    dest, listing = tmp_path / "ws", tmp_path / "export.json"
    (dest / "tiny").mkdir(parents=True)
    os.symlink(victim, dest / "tiny" / "data")
    listing.write_text('["tiny/data/evil.txt"]')
    entries = [workspace.Entry("tiny/data/new.txt", b"pwned")]
    with pytest.raises(confine.Escape, match="symlink"):
        workspace.sync(dest, entries, listing)
    assert sorted(p.name for p in victim.iterdir()) == ["evil.txt"]
    workspace.sync(dest, [workspace.Entry("other.txt", b"1")], listing)  # drops tiny/data/evil.txt
    assert (victim / "evil.txt").exists()  # the delete did not go through the link
    with pytest.raises(confine.Escape, match="absolute"):
        workspace.sync(dest, [workspace.Entry("l", b"", link=str(victim))], listing)


def test_archive_link_chain_is_refused_by_resolution(tmp_path: Path) -> None:
    """Issue 34: `a -> .` and `up -> a/a/../..` pass a check of the link text (each stays
    inside written out), but resolved step by step `up` is the root's parent."""
    raw = tar_of(("t/keep.txt", "1"), ("t/a", "-> ."), ("t/up", "-> a/a/../.."))
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar, pytest.raises(
        archive.ArchiveError, match="resolves above the root"
    ):
        archive.extract_tar(tar, tmp_path / "out", "test", inner_links=True)
    assert not (tmp_path / "out" / "t" / "up").is_symlink()


def test_build_source_link_chain_and_submodule_path_never_touch_outside(tmp_path: Path) -> None:
    """Issue 34: a build source with `a -> .` and `up -> a/a/../..` and a
    [[build.source.submodule]] path "up/victim": the old code emptied and filled
    deps/victim, outside the export. Real repositories, the real cache, `git archive`."""
    from pinwheel.compile.sources import supply
    from pinwheel.manifest.build import BuildSource, Submodule
    from pinwheel.source.cache import Cache

    dep = Upstream(tmp_path / "dep")
    os.symlink(".", dep.work / "a")
    os.symlink("a/a/../..", dep.work / "up")
    commit = dep.commit({"VALUE.txt": "one\n"}, "dep with a link chain")
    dep.publish()
    sub = Upstream(tmp_path / "sub")
    sub_commit = sub.commit({"PLANTED.txt": "planted\n"}, "submodule")
    sub.publish()
    urls = {"https://example.invalid/dep.git": dep.bare, "https://example.invalid/sub.git": sub.bare}
    cache = Cache(tmp_path / "c", {u: str(p) for u, p in urls.items()})
    deps = tmp_path / "c" / "deps"
    (deps / "victim").mkdir(parents=True)
    (deps / "victim" / "precious.txt").write_text("keep me\n")
    src = BuildSource(
        name="dep", url="https://example.invalid/dep.git", commit=commit, ref="main",
        variables=("DEP_SRC_DIR",), patches=(), exclude=(), omit=False, reason=None,
        used="yes",
        submodules=(Submodule("up/victim", "https://example.invalid/sub.git", sub_commit),),
    )  # fmt: skip
    with pytest.raises(PinwheelError, match="above the root"):
        supply([src], project=tmp_path, dest=deps, cache=cache)
    assert sorted(p.name for p in (deps / "victim").iterdir()) == ["precious.txt"]


def test_submodule_path_through_a_link_is_refused_even_if_the_archive_check_passed(
    tmp_path: Path, victim: Path
) -> None:
    """The submodule step itself resolves its path: a link on disk leading out stops it."""
    root = tmp_path / "export"
    root.mkdir()
    os.symlink("..", root / "up")
    with pytest.raises(confine.Escape):
        confine.resolve("up/victim", confine.disk_readlink(root), root=root)
    assert confine.remove_beneath(root, "up/victim") is False
    with pytest.raises(confine.Escape, match="symlink"):
        confine.mkdir_beneath(root, "up/victim/x")
    assert (victim / "evil.txt").exists()


def test_a_folder_another_run_makes_first_is_taken_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs making ``locks/`` at once: the one whose mkdir loses the race opens the
    folder the other made (CI saw "locks: already exists as something"); a link planted
    in that instant is still refused."""
    real_mkdir = os.mkdir

    def other_run_first(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(name, mode, dir_fd=dir_fd)  # the other run wins the race
        real_mkdir(name, mode, dir_fd=dir_fd)  # ours: FileExistsError

    monkeypatch.setattr(confine.os, "mkdir", other_run_first)
    confine.mkdir_beneath(tmp_path, "locks/repos")
    assert (tmp_path / "locks" / "repos").is_dir()

    def link_planted_first(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        os.symlink("/", name, dir_fd=dir_fd)
        real_mkdir(name, mode, dir_fd=dir_fd)

    monkeypatch.setattr(confine.os, "mkdir", link_planted_first)
    with pytest.raises(confine.Escape, match="symlink"):
        confine.mkdir_beneath(tmp_path, "memo/x")


def test_directory_walk_refuses_a_chain_and_a_fifo(tmp_path: Path) -> None:
    """dir_entries (kernels' sources, staged build sources) walks by resolution too."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f.txt").write_text("1")
    os.symlink(".", tree / "a")
    os.symlink("a/a/../..", tree / "up")
    with pytest.raises(confine.Escape, match="above the root"):
        list(workspace.dir_entries(tree))
    (tree / "up").unlink()
    os.symlink("a/a/f.txt", tree / "ok")  # a chain that stays inside is kept
    assert {e.rel: e.link for e in workspace.dir_entries(tree)} == {
        "a": ".", "f.txt": None, "ok": "a/a/f.txt"
    }  # fmt: skip
    os.mkfifo(tree / "pipe")
    with pytest.raises(confine.Escape, match="FIFO"):
        list(workspace.dir_entries(tree))
