"""Confinement: every write, rename and delete stays inside its scope.

A scope is a directory pinwheel was told to own for one operation: the cache
(``--cache``), ``--dest``, ``--out``, the manifest's folder. A target inside it
is named by a value that may come from a manifest, a receipt, an archive or a
server (``../../x``, an absolute path) or reached through a symlink someone
planted (``repos -> /home``, ``.x.part -> ~/.bashrc``). :func:`inside` resolves
the target's parent with every symlink followed and checks that it is still
under the scope's real path; the last component itself is never followed (a
symlink there is replaced or removed, not written through).

Each helper raises :class:`Escape` (a :class:`~pinwheel.errors.PinwheelError`)
before touching anything outside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_bytes


class Escape(PinwheelError):
    """A path that would leave its scope."""


def _lexical(scope: Path, target: Path | str) -> Path:
    t = Path(target)
    full = t if t.is_absolute() else scope / t
    return Path(os.path.normpath(os.path.abspath(full)))


def inside(scope: Path | str, target: Path | str, *, what: str = "path") -> Path:
    """``target`` (absolute, or relative to ``scope``) checked to stay in ``scope``.

    Returns the path with its parent fully resolved and its last component as
    named (not followed). Refuses ``..`` that climbs out, an absolute path
    elsewhere, and a symlinked directory anywhere on the way that leads out.
    """
    scope_real = Path(os.path.realpath(scope))
    lexical = _lexical(Path(os.path.abspath(scope)), target)
    scope_abs = Path(os.path.abspath(scope))
    if not (lexical == scope_abs or lexical.is_relative_to(scope_abs)) and not (
        lexical == scope_real or lexical.is_relative_to(scope_real)
    ):
        raise Escape(
            f"refusing a {what} outside {scope}: {target}",
            where=str(target),
            next="a path from a manifest, receipt, archive or server must stay inside "
            f"{scope}; fix the value that names it",
        )
    if lexical in (scope_abs, scope_real):
        return scope_real
    parent = Path(os.path.realpath(lexical.parent))
    if not (parent == scope_real or parent.is_relative_to(scope_real)):
        raise Escape(
            f"refusing a {what} reached through a symlink out of {scope}: {target} "
            f"(its folder resolves to {parent})",
            where=str(target),
            next=f"remove the symlink under {scope} and run again",
        )
    return parent / lexical.name


def mkdirs(scope: Path | str, target: Path | str) -> Path:
    """``mkdir -p`` of a directory inside ``scope`` (no symlink on the way leads out)."""
    path = inside(scope, target, what="directory")
    Path(scope).mkdir(parents=True, exist_ok=True)
    rel = path.relative_to(Path(os.path.realpath(scope)))
    cur = Path(os.path.realpath(scope))
    for part in rel.parts:
        cur = cur / part
        if cur.is_symlink():
            real = Path(os.path.realpath(cur))
            if not real.is_relative_to(Path(os.path.realpath(scope))):
                raise Escape(
                    f"refusing a directory reached through a symlink out of {scope}: {cur}",
                    where=str(cur),
                    next=f"remove the symlink under {scope} and run again",
                )
        cur.mkdir(exist_ok=True)
    return path


def write_bytes(scope: Path | str, target: Path | str, data: bytes, mode: int = 0o644) -> Path:
    """Atomic write inside ``scope``; a symlink at ``target`` is replaced, not followed."""
    path = inside(scope, target, what="file")
    mkdirs(scope, path.parent)
    atomic_write_bytes(path, data, mode)
    return path


def write_text(scope: Path | str, target: Path | str, text: str, mode: int = 0o644) -> Path:
    return write_bytes(scope, target, text.encode("utf-8"), mode)


@contextlib.contextmanager
def open_append(scope: Path | str, target: Path | str) -> Iterator[BinaryIO]:
    """Open ``target`` for appending without following a symlink or a hard link planted there."""
    path = inside(scope, target, what="file")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if path.is_symlink():
            raise Escape(
                f"refusing to write through a symlink: {path}",
                where=str(path),
                next="remove it and run again",
            ) from None
        raise exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise Escape(
            f"refusing to write to {path}: not a plain file of its own",
            where=str(path),
            next="remove it and run again",
        )
    with os.fdopen(fd, "ab") as fh:
        yield fh


def open_read(scope: Path | str, target: Path | str) -> BinaryIO:
    """Open a file inside ``scope`` for reading; a symlink there is refused."""
    path = inside(scope, target, what="file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Escape(f"not a plain file: {path}", where=str(path))
    return os.fdopen(fd, "rb")


def replace(scope: Path | str, src: Path | str, dst: Path | str) -> Path:
    """``os.replace`` with both ends inside ``scope``."""
    a = inside(scope, src, what="file")
    b = inside(scope, dst, what="file")
    os.replace(a, b)
    return b


def remove(scope: Path | str, target: Path | str) -> None:
    """Delete a file, a symlink (the link only) or a directory tree inside ``scope``.

    A tree is removed without following any symlink inside it.
    """
    path = inside(scope, target, what="path to remove")
    if Path(path) == Path(os.path.realpath(scope)):
        raise Escape(f"refusing to remove the scope itself: {scope}", where=str(scope))
    if path.is_symlink() or not path.exists():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
