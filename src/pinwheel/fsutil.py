"""Atomic writes: a reader sees the old file or the new one, never half of either; and
tree removal that no depth, link or special file can derail."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0)
_NAME_TAKEN = (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR)


def remove_tree(
    path: Path | str, *, dir_fd: int | None = None, ignore_errors: bool = False
) -> None:
    """Remove ``path``: a file, a link (the link only) or a directory tree of any depth.

    ``shutil.rmtree`` recurses once per level: a tree a thousand folders deep (a hostile
    archive, a cache a bug filled) ends it in ``RecursionError``. Here every folder below
    the top is first renamed up into the top folder, then emptied, so the walk holds two
    descriptors and no stack, whatever the depth. No link inside is followed and a FIFO
    or socket is unlinked, never opened. With ``ignore_errors`` an ``OSError`` is dropped
    (what could be removed is gone); a missing ``path`` is never an error.
    """
    try:
        _remove_tree(os.fspath(path), dir_fd)
    except OSError:
        if not ignore_errors:
            raise


def _remove_tree(name: str, dir_fd: int | None) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    _remove_dir(name, dir_fd)


def _remove_dir(name: str, dir_fd: int | None) -> None:
    """Empty folder ``name`` (of ``dir_fd``) through its own descriptor, then remove it."""
    top = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        _empty(top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=dir_fd)


def _empty(top: int) -> None:
    """Empty the folder open as ``top``: a worklist of folders directly under it."""
    serial = itertools.count()
    pending: list[str | None] = [None]  # None: ``top`` itself
    while pending:
        sub = pending.pop()
        if sub is None:
            fd = top
        else:
            try:
                fd = os.open(sub, _DIR_FLAGS, dir_fd=top)
            except FileNotFoundError:
                continue  # an empty folder a hoisted one replaced: already handled
        try:
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            for entry, is_dir in entries:
                if not is_dir:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry, dir_fd=fd)
                elif sub is None:
                    pending.append(entry)
                elif (hoisted := _hoist(fd, entry, top, serial)) is not None:
                    pending.append(hoisted)
        finally:
            if fd != top:
                os.close(fd)
        if sub is not None:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(sub, dir_fd=top)


def _hoist(fd: int, entry: str, top: int, serial: itertools.count[int]) -> str | None:
    """Rename folder ``entry`` of ``fd`` to a fresh name directly under ``top`` and return
    it; None where the folder, on another file system, was removed on the spot."""
    while True:
        new = f".pinwheel-rm.{os.getpid()}.{next(serial)}"
        try:
            os.rename(entry, new, src_dir_fd=fd, dst_dir_fd=top)
            return new
        except OSError as exc:
            if exc.errno == errno.EXDEV:  # a mount point inside the tree: its own walk
                _remove_dir(entry, fd)
                return None
            if exc.errno not in _NAME_TAKEN:
                raise


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Build a directory under a temp name beside ``final``; rename it into place on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        swap_dir(tmp, final)
    except BaseException:
        remove_tree(tmp, ignore_errors=True)
        raise


def swap_dir(new: Path, final: Path) -> None:
    """Put directory ``new`` at ``final``, replacing what is there.

    Two renames: ``final`` -> ``.final.old``, ``new`` -> ``final``. A crash
    between them leaves ``.final.old`` beside a missing ``final``;
    :func:`recover_dir` puts it back.
    """
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        remove_tree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(new, final)
        remove_tree(old, ignore_errors=True)
    else:
        os.replace(new, final)


def recover_dir(final: Path) -> None:
    """Undo a :func:`swap_dir` that was interrupted between its two renames."""
    old = final.with_name(f".{final.name}.old")
    if not final.exists() and old.is_dir():
        os.replace(old, final)
    remove_tree(old, ignore_errors=True)


def free_space(path: Path) -> str:
    """Free space on the file system holding ``path`` (its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = float(shutil.disk_usage(probe).free)
    except OSError:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"  # pragma: no cover


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (multi-GiB wheels: no second copy on the same
    filesystem), a copy where linking is not possible; a directory is copied whole."""
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
