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
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_bytes, remove_tree


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
        try:
            cur.mkdir(exist_ok=True)
        except FileExistsError:  # a file (or a link to one) where a folder belongs
            raise Escape(
                f"a file is in the way of the folder {cur}",
                where=str(cur),
                next=f"remove {cur} (or choose an empty folder) and run again",
            ) from None
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
        remove_tree(path)
    else:
        path.unlink()


# --------------------------------------------------------------------------- resolved paths
#
# The checks above compare text (after ``realpath``) at one moment. A tree pinwheel
# writes or reads from an untrusted source (a replayed tree, a build source, a kept
# workspace, an archive) is judged instead by resolving every link against its root
# the way the kernel does, one component at a time: a link's target is substituted and
# resolved from the link's folder, ``..`` is taken on the *resolved* path, and any step
# above the root is an escape. ``a -> .`` with ``up -> a/a/../..`` reads as ``up`` =
# the root's parent, although neither link's text leaves the tree. Writers below go one
# step further: they open every folder on the way with ``O_NOFOLLOW`` relative to the
# one before (``openat``), so no symlink anywhere on the way is ever gone through.

MAX_LINK_HOPS = 40  # as Linux's path resolution (ELOOP)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
ReadLink = Callable[[tuple[str, ...]], "str | None"]


def _escape(rel: str, root: object, why: str) -> Escape:
    return Escape(
        f"refusing {rel[:200]!r} under {root}: {why}",
        where=f"{root}/{rel[:200]}",
        next="the tree (an archive, a build source, a kept workspace) holds a link that "
        "leads out of it; do not use this tree",
    )


def resolve(rel: str, readlink: ReadLink, *, root: object = "the tree") -> tuple[str, ...]:
    """``rel`` resolved inside a tree whose links ``readlink(parts)`` tells (None: not a
    link), every link followed, last component included. Returns the resolved parts;
    raises :class:`Escape` when any step climbs above the root, a link is absolute, or
    more than :data:`MAX_LINK_HOPS` links are followed (a loop)."""
    if rel.startswith("/") or "\0" in rel:
        raise _escape(rel, root, "an absolute name")
    pending = list(reversed(rel.split("/")))
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                raise _escape(rel, root, "it resolves above the root")
            resolved.pop()
            continue
        target = readlink((*resolved, part))
        if target is None:
            resolved.append(part)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise _escape(rel, root, f"more than {MAX_LINK_HOPS} links (a loop)")
        if not target or target.startswith("/") or "\0" in target:
            raise _escape(rel, root, f"a link to an absolute or empty target {target[:200]!r}")
        pending.extend(reversed(target.split("/")))
    return tuple(resolved)


def disk_readlink(
    root: Path | str, overlay: Mapping[tuple[str, ...], str] | None = None
) -> ReadLink:
    """A :data:`ReadLink` for a directory on disk (``lstat``, never followed); ``overlay``
    adds links about to be made."""
    base = Path(root)

    def readlink(parts: tuple[str, ...]) -> str | None:
        if overlay and parts in overlay:
            return overlay[parts]
        path = base.joinpath(*parts)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return os.readlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None

    return readlink


def check_link(root: Path | str, rel: str, target: str, readlink: ReadLink | None = None) -> None:
    """Refuse a link ``rel -> target`` under ``root`` that resolves out of it (chains
    through other links included). ``readlink`` defaults to the tree on disk."""
    parts = _parts(rel, root)
    base = readlink or disk_readlink(root)

    def with_link(p: tuple[str, ...]) -> str | None:
        return target if p == parts else base(p)

    resolve(rel, with_link, root=root)


def _parts(rel: str, root: object) -> tuple[str, ...]:
    if not rel or rel.startswith("/") or "\0" in rel or "\\" in rel:
        raise _escape(rel, root, "an absolute, empty or backslashed name")
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    if not parts or ".." in parts:
        raise _escape(rel, root, "'..' or no name")
    return parts


def _step(fd: int, name: str, rel: str, root: object, create: bool) -> int:
    try:
        return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        with contextlib.suppress(FileExistsError):  # another run made it since: take theirs
            os.mkdir(name, 0o755, dir_fd=fd)
        return _step(fd, name, rel, root, create=False)  # what is there now, checked again
    except OSError:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise _escape(rel, root, f"{name!r} on the way is a symlink") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _escape(rel, root, f"{name!r} on the way is not a folder") from None
        raise


@contextlib.contextmanager
def _folder(root: Path | str, parts: Sequence[str], rel: str, *, create: bool) -> Iterator[int]:
    """An fd of ``root/parts``, every step opened ``O_NOFOLLOW`` from the one before."""
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for name in parts:
            nxt = _step(fd, name, rel, root, create)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def folder_beneath(root: Path | str, rel: str) -> Iterator[int]:
    """An fd of the folder ``root/rel`` (``""``: ``root`` itself), every step opened
    ``O_NOFOLLOW`` from the one before: a symlink on the way is :class:`Escape`."""
    parts = _parts(rel, root) if rel else ()
    with _folder(root, parts, rel or ".", create=False) as fd:
        yield fd


def lstat_beneath(root: Path | str, rel: str) -> os.stat_result | None:
    """``lstat`` of ``root/rel`` with no symlink on the way; None when it is not there
    (or a symlink on the way means it is not part of the tree)."""
    parts = _parts(rel, root)
    try:
        with _folder(root, parts[:-1], rel, create=False) as fd:
            return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError, Escape):
        return None


def read_beneath(root: Path | str, rel: str) -> bytes:
    """The bytes of the plain file ``root/rel``; no symlink followed anywhere."""
    parts = _parts(rel, root)
    with _folder(root, parts[:-1], rel, create=False) as fd:
        try:
            f = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW, dir_fd=fd)
        except OSError:
            if stat.S_ISLNK(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode):
                raise _escape(rel, root, "it is a symlink") from None
            raise
        with os.fdopen(f, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise _escape(rel, root, "not a plain file")
            return fh.read()


def open_beneath(root: Path | str, rel: str) -> BinaryIO:
    """The regular file ``root/rel`` open for reading, no symlink followed on the way or
    at the end, never blocking on a FIFO: :class:`Escape` for a link, FIFO or device
    (``FileNotFoundError`` when it is not there)."""
    parts = _parts(rel, root)
    with _folder(root, parts[:-1], rel, create=False) as fd:
        flags = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
        try:
            f = os.open(parts[-1], flags, dir_fd=fd)
        except OSError:
            if stat.S_ISLNK(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode):
                raise _escape(rel, root, "it is a symlink") from None
            raise
    if not stat.S_ISREG(os.fstat(f).st_mode):
        os.close(f)
        raise _escape(rel, root, "not a plain file")
    os.set_blocking(f, True)
    return os.fdopen(f, "rb")


def mkdir_beneath(root: Path | str, rel: str) -> None:
    """``mkdir -p root/rel``; a symlink on the way is refused, never gone through."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with _folder(root, _parts(rel, root), rel, create=True):
        pass


def folder_in_cache(cache: Path | str, rel: str, *, what: str = "folder") -> Path:
    """``cache/rel`` made (``mkdir -p``) one folder at a time from the cache root, each
    opened ``O_NOFOLLOW`` from the one before: a folder of the cache someone replaced by a
    link (``build -> /elsewhere``) is refused with its name, never gone through. Every
    writer that starts from a folder deeper than the cache (a workspace, the memo root,
    the compiler cache's run folder) gets its folder here first."""
    try:
        mkdir_beneath(cache, rel)
    except Escape as exc:
        where = Path(cache) / rel
        raise Escape(
            f"refusing the cache's {what} {where}: a folder on the way is a symlink or not "
            f"a folder ({exc.what})",
            where=str(where),
            next=f"remove {where} (or the link above it) from the cache, or run "
            "`pinwheel cache clean --yes`, and run again",
        ) from None
    return Path(cache) / rel


def _clear(fd: int, name: str) -> None:
    """Remove whatever ``name`` is in folder ``fd`` (a tree without following links)."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        remove_tree(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)


def write_beneath(
    root: Path | str, rel: str, data: bytes, *, mode: int = 0o644, mtime: int | None = None
) -> None:
    """Atomically put ``data`` at ``root/rel`` (what is there, a link included, is replaced,
    never written through); a symlink on the way is refused."""
    _put_beneath(root, rel, lambda fh: fh.write(data), mode=mode, mtime=mtime)


def copy_beneath(root: Path | str, rel: str, source: Path | str, *, mode: int = 0o644) -> None:
    """:func:`write_beneath` of the bytes of the file ``source``, streamed (a wheel of
    hundreds of MB is never held in memory)."""
    with open(source, "rb") as src:
        _put_beneath(root, rel, lambda fh: shutil.copyfileobj(src, fh, 1024 * 1024), mode=mode)


def _put_beneath(
    root: Path | str,
    rel: str,
    fill: Callable[[BinaryIO], object],
    *,
    mode: int = 0o644,
    mtime: int | None = None,
) -> None:
    """A temporary file made ``O_EXCL | O_NOFOLLOW`` beside ``root/rel`` (folders opened
    ``O_NOFOLLOW`` one by one), filled, then renamed over ``rel``."""
    parts = _parts(rel, root)
    Path(root).mkdir(parents=True, exist_ok=True)
    with _folder(root, parts[:-1], rel, create=True) as fd:
        name = parts[-1]
        st = None
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if st is not None and stat.S_ISDIR(st.st_mode):
            remove_tree(name, dir_fd=fd)
        tmp = f".{name[:100]}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=fd)
        try:
            with os.fdopen(f, "wb") as fh:
                fill(fh)
                os.fchmod(fh.fileno(), mode)
            if mtime is not None:
                os.utime(tmp, (mtime, mtime), dir_fd=fd, follow_symlinks=False)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            raise


def symlink_beneath(root: Path | str, rel: str, target: str) -> None:
    """Make the link ``root/rel -> target`` (replacing what is there) after checking that
    it resolves inside ``root``; a symlink on the way is refused."""
    parts = _parts(rel, root)
    check_link(root, rel, target)
    Path(root).mkdir(parents=True, exist_ok=True)
    with _folder(root, parts[:-1], rel, create=True) as fd:
        _clear(fd, parts[-1])
        os.symlink(target, parts[-1], dir_fd=fd)


def remove_beneath(root: Path | str, rel: str) -> bool:
    """Delete ``root/rel`` (a link: the link only; a folder: its tree, links not followed).
    Nothing is done when it is not there or a symlink on the way means it is not part of
    the tree (a folder replaced by a link). True when something was removed."""
    parts = _parts(rel, root)
    try:
        with _folder(root, parts[:-1], rel, create=False) as fd:
            try:
                os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            _clear(fd, parts[-1])
            return True
    except (FileNotFoundError, NotADirectoryError, Escape):
        return False


def set_mtime_beneath(root: Path | str, rel: str, mtime: int) -> None:
    parts = _parts(rel, root)
    with _folder(root, parts[:-1], rel, create=False) as fd:
        os.utime(parts[-1], (mtime, mtime), dir_fd=fd, follow_symlinks=False)


class TreeWriter:
    """Many files written under one ``root``, each folder opened once.

    Writing a tree one path at a time (:func:`inside`, then :func:`mkdirs`, then
    :func:`open_append`) resolves every folder on the way again for every file: an
    archive of 13,600 files spent half its time in ``realpath``. Here each folder is
    opened ``O_NOFOLLOW`` from the one before it, once, and kept (at most ``max_open``
    at a time; one closed is opened again when needed), and each file is made in its
    folder's fd: nothing is resolved by path, so a symlink planted on the way is never
    gone through.

    :meth:`write` does only the plain case and says ``False`` for anything else, before
    reading a byte of the source: a symlink on the way (which :func:`inside` allows when
    it leads inside the scope), a link, folder, FIFO, device or hard-linked file at the
    target. The caller then takes the checked one-path-at-a-time route, which replaces
    or refuses it as before.
    """

    def __init__(self, root: Path | str, *, max_open: int = 64) -> None:
        self.root = Path(root)
        self.max_open = max_open
        self._fds: dict[tuple[str, ...], int] = {}

    def __enter__(self) -> TreeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def _folder(self, parts: tuple[str, ...], rel: str) -> int:
        fd = self._fds.get(parts)
        if fd is not None:
            return fd
        if parts:
            fd = _step(self._folder(parts[:-1], rel), parts[-1], rel, self.root, create=True)
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root, os.O_RDONLY | _DIRECTORY)
        if len(self._fds) >= self.max_open:
            self.close()  # a tree streams folder by folder: the ones needed are opened again
        self._fds[parts] = fd
        return fd

    def mkdir(self, rel: str) -> bool:
        """``mkdir -p root/rel`` through folders opened ``O_NOFOLLOW``; False when something
        on the way is not a plain folder (the caller's checked route decides)."""
        try:
            self._folder(_parts(rel, self.root), rel)
        except (Escape, OSError):
            return False
        return True

    def write(self, rel: str, src: IO[bytes], mode: int, mtime: float | None = None) -> bool:
        """Write ``src`` to ``root/rel`` (replacing a plain file's bytes), then ``mode`` and
        ``mtime`` (None: left at the time of writing). False, with nothing read from
        ``src``, when that is not the plain case (see the class)."""
        parts = _parts(rel, self.root)
        try:
            folder = self._folder(parts[:-1], rel)
            flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW | os.O_CLOEXEC
            fd = os.open(parts[-1], flags, 0o600, dir_fd=folder)
        except (Escape, OSError):  # a link or folder there, a FIFO with no reader...
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            os.close(fd)
            return False
        with os.fdopen(fd, "wb") as fh:
            os.set_blocking(fd, True)
            fh.truncate(0)
            shutil.copyfileobj(src, fh, 1 << 20)
            fh.flush()
            os.fchmod(fd, mode)
            if mtime is not None:
                os.utime(fd, (mtime, mtime))
        return True


@dataclass(frozen=True)
class Node:
    """One entry of a walked tree: ``kind`` is ``file``, ``dir`` or ``link``."""

    rel: str
    kind: str
    mode: int = 0
    size: int = 0
    link: str | None = None


def walk(root: Path | str, skip: Callable[[str], bool] = lambda name: False) -> Iterator[Node]:
    """Every entry under ``root`` (sorted, folders first visited), without following a
    link; each link checked to resolve inside ``root`` (chains included); a FIFO, socket
    or device refused. ``skip(name)``: folders not descended into."""
    base = Path(root)
    readlink = disk_readlink(base)

    def visit(prefix: str) -> Iterator[Node]:
        with os.scandir(base / prefix if prefix else base) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            rel = f"{prefix}{e.name}"
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(e.path)
                resolve(rel, readlink, root=root)
                yield Node(rel, "link", st.st_mode, 0, target)
            elif stat.S_ISDIR(st.st_mode):
                if skip(e.name):
                    continue
                yield Node(rel, "dir", st.st_mode)
                yield from visit(rel + "/")
            elif stat.S_ISREG(st.st_mode):
                yield Node(rel, "file", st.st_mode, st.st_size)
            else:
                raise _escape(rel, root, "a FIFO, socket or device in a source tree")

    yield from visit("")


# --------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Tally:
    """What a tree holds, as :func:`tally` counted it (``bytes`` of what ``lstat`` says)."""

    bytes: int = 0
    files: int = 0  # regular files
    links: int = 0  # symlinks: counted (their own size), never followed
    special: int = 0  # FIFOs, sockets, devices: counted, never opened
    unreadable: int = 0  # folders that could not be listed (permissions, gone meanwhile)
    # bytes of files (among ``files``, not in ``bytes``) that are hard links to a file
    # already counted in the same measurement (``seen``): on disk once, counted once
    shared: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(*(a + b for a, b in zip(_fields(self), _fields(other), strict=True)))


def _fields(t: Tally) -> tuple[int, int, int, int, int, int]:
    return (t.bytes, t.files, t.links, t.special, t.unreadable, t.shared)


#: (device, inode) of the multiply linked files a measurement has counted already.
Seen = set[tuple[int, int]]


def _count(st: os.stat_result, seen: Seen | None = None) -> Tally:
    if stat.S_ISREG(st.st_mode):
        if seen is not None and st.st_nlink > 1:
            if (st.st_dev, st.st_ino) in seen:
                return Tally(files=1, shared=st.st_size)
            seen.add((st.st_dev, st.st_ino))
        return Tally(bytes=st.st_size, files=1)
    if stat.S_ISLNK(st.st_mode):
        return Tally(bytes=st.st_size, links=1)
    return Tally(special=1)


def _listed(fd: int, seen: Seen | None = None) -> tuple[Tally, list[str]]:
    """The non-folder entries of the folder open as ``fd``, counted; its sub-folders' names."""
    counted = Tally()
    folders: list[str] = []
    with os.scandir(fd) as it:
        entries = list(it)
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while listed
        if stat.S_ISDIR(st.st_mode):
            folders.append(e.name)
        else:
            counted += _count(st, seen)
    return counted, folders


def tally_at(dir_fd: int, name: str, *, where: str = "", seen: Seen | None = None) -> Tally:
    """Count entry ``name`` of the folder open as ``dir_fd`` (a file, a link or a folder
    tree) without following a link, opening a FIFO or device, or recursing. Each folder is
    opened ``O_NOFOLLOW`` from its parent's descriptor and left by ``..`` checked against
    the parent's device and inode, so the walk holds two descriptors and a list of
    pending names at any depth, and builds no path (a tree deeper than PATH_MAX is
    counted). A tree changed under the walk so that ``..`` is not where it came from is
    an error, never a count of somewhere else. ``seen``, shared by the calls of one
    measurement: a file hard-linked more than once is counted in ``bytes`` the first
    time, in ``shared`` after (as ``du``)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return Tally()
    if not stat.S_ISDIR(st.st_mode):
        return _count(st, seen)
    try:
        fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return Tally()
    except OSError:  # unreadable, or replaced by a link or file since the stat
        return Tally(unreadable=1)
    total = Tally()
    # One level per folder on the current path: its identity and the sub-folders to visit.
    levels: list[tuple[tuple[int, int], list[str]]] = []
    try:
        while True:
            here = os.fstat(fd)
            try:
                counted, folders = _listed(fd, seen)
            except PermissionError:
                counted, folders = Tally(unreadable=1), []
            total += counted
            levels.append(((here.st_dev, here.st_ino), folders))
            child = None
            while levels and child is None:
                pending = levels[-1][1]
                if not pending:
                    levels.pop()
                    if levels:
                        fd = _up(fd, levels[-1][0], where or name)
                    continue
                try:
                    child = os.open(pending.pop(), os.O_RDONLY | _DIRECTORY | _NOFOLLOW,
                                    dir_fd=fd)  # fmt: skip
                except FileNotFoundError:
                    continue  # removed meanwhile
                except OSError:  # unreadable, or replaced by a link or file meanwhile
                    total += Tally(unreadable=1)
            if child is None:
                return total
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def _up(fd: int, parent: tuple[int, int], where: str) -> int:
    """The parent of the folder open as ``fd`` (``fd`` closed), checked to be ``parent``."""
    up = os.open("..", os.O_RDONLY | _DIRECTORY, dir_fd=fd)
    back = os.fstat(up)
    if (back.st_dev, back.st_ino) != parent:
        os.close(up)  # ``fd`` stays open: the caller closes it
        raise PinwheelError(
            "a folder was moved while it was measured",
            where=where,
            next="run the command again once nothing else writes there",
        )
    os.close(fd)
    return up


def tally_children(
    dir_fd: int, name: str, *, where: str, seen: Seen | None = None
) -> list[tuple[str, bool, Tally]]:
    """Each entry directly under folder ``name`` of the folder open as ``dir_fd``: its
    name, whether it is a folder, and its count by :func:`tally_at`; the folder opened
    ``O_NOFOLLOW`` (a link there is an :class:`Escape`, never followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise _escape(name, where, "it is a symlink") from None
        raise exc
    try:
        with os.scandir(fd) as it:
            names = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        return [(n, folder, tally_at(fd, n, where=f"{where}/{n}", seen=seen))
                for n, folder in names]  # fmt: skip
    finally:
        os.close(fd)
