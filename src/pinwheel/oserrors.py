"""What an OS error means for the user: the path, what is wrong with it, what to do.

Stages let ``OSError`` through (a cache that is a file, a read-only output
directory, a full disk); the CLI turns it into a :class:`PinwheelError` here,
once, instead of printing ``[Errno 21] Is a directory``. A full disk names the
file system the failed write went to and its free space, not the cache's.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from pinwheel.errors import PinwheelError
from pinwheel.fsutil import free_space
from pinwheel.printable import shown_cmd

_WRITE_HINT = "pass --cache DIR (or set PINWHEEL_CACHE) / the command's output option"

# errno -> (what is wrong, what to do); ``{shown}`` is the path, ``{hint}`` _WRITE_HINT.
_PLAIN: dict[int, tuple[str, str]] = {
    errno.EROFS: ("read-only file system: cannot write here", "write to a writable place: {hint}"),
    errno.EACCES: ("permission denied", "check its owner and mode (`ls -ld {shown}`), or {hint}"),
    errno.EPERM: ("permission denied", "check its owner and mode (`ls -ld {shown}`), or {hint}"),
    errno.EISDIR: (
        "a directory, where a file is expected",
        "pass the file itself (for a manifest: DIR/manifest.toml)",
    ),
    errno.ENOENT: ("does not exist", "check the path (and that its parent directories exist)"),
    errno.ELOOP: ("too many levels of symbolic links", "fix the link loop (`ls -l {shown}`)"),
    errno.ENOTEMPTY: ("a directory that is not empty", "move it out of the way, then run again"),
    errno.EXDEV: (
        "cannot move this across file systems",
        "keep the output and the cache on one file system",
    ),
    errno.EMFILE: ("too many open files", "raise the limit (`ulimit -n 4096`), then run again"),
    errno.ENFILE: ("too many open files", "raise the limit (`ulimit -n 4096`), then run again"),
    errno.EIO: (
        "input/output error reading or writing this file",
        "check the disk (dmesg), then run again",
    ),
}


def _blocker(path: Path) -> Path | None:
    """The nearest part of ``path`` that exists and is not a directory (ENOTDIR's cause)."""
    for part in [path, *path.parents]:
        if part.exists() or part.is_symlink():
            return part if not part.is_dir() else None
    return None


def explain(err: OSError, cache: Path | None = None) -> PinwheelError:
    """A PinwheelError for ``err`` with what, where (the path) and next."""
    name = err.filename if err.filename is not None else err.filename2
    path = Path(os.fsdecode(name)) if name is not None else None
    shown = str(path) if path is not None else "(the OS did not name the file)"
    code = err.errno
    reason = err.strerror or str(err)

    if code in (errno.ENOSPC, errno.EDQUOT):
        if path is not None:
            return PinwheelError(
                f"disk full: no space left writing this file "
                f"(its file system has {free_space(path)} free)",
                where=shown,
                next="free space on that file system (`pinwheel cache du` shows what the "
                "cache holds; `pinwheel cache prune` frees it), or write elsewhere, then run "
                "again",
            )
        places = [("temporary directory", Path(tempfile.gettempdir()))]
        if cache is not None:
            places.insert(0, ("cache", cache))
        free = ", ".join(f"{label} {p}: {free_space(p)} free" for label, p in places)
        return PinwheelError(
            f"disk full: a write failed with no space left ({free})",
            where=shown,
            next="free space where it is short (set TMPDIR to move temporary files), "
            "then run again",
        )
    if code == errno.ENOTDIR:
        blocker = _blocker(path) if path is not None else None
        what = (
            f"this is a file, but {shown} needs it to be a directory"
            if blocker is not None
            else "a part of this path is not a directory"
        )
        return PinwheelError(
            what,
            where=str(blocker or shown),
            next="move that file out of the way, or choose another path",
        )
    if code == errno.EEXIST:
        kind = "a file" if path is not None and path.is_file() else "something"
        return PinwheelError(
            f"already exists as {kind}, where pinwheel needs to make a directory",
            where=shown,
            next="move it out of the way, or choose another path",
        )
    if code == errno.ENAMETOOLONG:
        return PinwheelError(
            "a path too long for the file system",
            where=shown[:200],
            next="use a shorter --cache or output path",
        )
    if code in _PLAIN:
        what, then = _PLAIN[code]
        quoted = shown_cmd(path) if path is not None else "PATH"
        return PinwheelError(what, where=shown, next=then.format(shown=quoted, hint=_WRITE_HINT))
    return PinwheelError(
        reason,
        where=shown,
        next="fix the path or its permissions, then run again",
    )
