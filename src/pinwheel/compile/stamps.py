"""File stamps: a file pinwheel wrote, recognised again without re-reading its bytes.

A :class:`Stamp` is what pinwheel recorded about a file it wrote: its sha256 and the
file's size, mtime_ns, ctime_ns, inode and device at that moment. :func:`sha256_of`
``lstat``\\ s the file: when every field still agrees, the recorded sha256 holds (a
rewrite changes size or times, a replacement the inode, and ``utime`` cannot set
ctime back); when any differs, or the record is malformed, the file is hashed again.
A stamp is never trusted blindly: it only saves a read of bytes nothing has touched.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import validate
from pinwheel.checksums import sha256_file

_MAX_INT = 1 << 63  # stat fields are 64-bit: anything larger is no stamp pinwheel wrote

# How a digest was obtained (what a phase says it skipped).
BY_STAMP = "stamp"


@dataclass(frozen=True)
class Stamp:
    sha256: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256, "size": self.size, "mtime_ns": self.mtime_ns,
            "ctime_ns": self.ctime_ns, "inode": self.inode, "device": self.device,
        }  # fmt: skip

    @classmethod
    def from_json(cls, raw: object) -> Stamp | None:
        """A stamp from a record pinwheel wrote; None for anything malformed (then the
        file is hashed: a bad record costs a read, never a wrong digest)."""
        if not isinstance(raw, Mapping):
            return None
        digest = raw.get("sha256")
        if not validate.is_sha256(digest):
            return None
        numbers = []
        for key in ("size", "mtime_ns", "ctime_ns", "inode", "device"):
            value = raw.get(key)
            # bool is an int in Python: True is no inode
            if type(value) is not int or not 0 <= value < _MAX_INT:
                return None
            numbers.append(value)
        return cls(digest, *numbers)

    def holds_for(self, st: os.stat_result) -> bool:
        return stat.S_ISREG(st.st_mode) and (
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_ino,
            st.st_dev,
        ) == (self.size, self.mtime_ns, self.ctime_ns, self.inode, self.device)


def take(path: Path) -> Stamp | None:
    """The stamp of ``path`` now (hashed); None when it is no regular file or it changed
    while it was hashed (such a file is hashed again next time)."""
    return sha256_of(path, None).stamp


@dataclass(frozen=True)
class Digest:
    """A file's sha256 (None: missing or no regular file), how it was obtained, and
    the stamp that holds for it now (None when none could be taken)."""

    sha256: str | None
    how: str
    stamp: Stamp | None

    @property
    def by_stamp(self) -> bool:
        return self.how == BY_STAMP


def sha256_of(path: Path, stamp: Stamp | None) -> Digest:
    """The sha256 of ``path``: from ``stamp`` when every recorded field still holds
    (:data:`BY_STAMP`), else ``"hashed (...why...)"`` after reading every byte. A file
    missing or not regular (a FIFO or a link put there) is never read."""
    try:
        before = os.lstat(path)
    except OSError as exc:
        return Digest(None, f"unreadable ({exc.strerror or exc})", None)
    if not stat.S_ISREG(before.st_mode):
        return Digest(None, "not a regular file", None)
    if stamp is not None and stamp.holds_for(before):
        return Digest(stamp.sha256, BY_STAMP, stamp)
    why = "no stamp" if stamp is None else "the stamp no longer holds: " + _differs(stamp, before)
    digest = sha256_file(path)
    after = os.lstat(path)
    fresh = None
    if _fields(before) == _fields(after):  # not written while it was read
        fresh = Stamp(digest, after.st_size, after.st_mtime_ns, after.st_ctime_ns,
                      after.st_ino, after.st_dev)  # fmt: skip
    return Digest(digest, f"hashed ({why})", fresh)


def _fields(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode)


def _differs(stamp: Stamp, st: os.stat_result) -> str:
    pairs = (("size", st.st_size, stamp.size), ("mtime", st.st_mtime_ns, stamp.mtime_ns),
             ("ctime", st.st_ctime_ns, stamp.ctime_ns), ("inode", st.st_ino, stamp.inode),
             ("device", st.st_dev, stamp.device))  # fmt: skip
    return ", ".join(name for name, now, then in pairs if now != then) + " changed"


__all__ = ["BY_STAMP", "Digest", "Stamp", "sha256_of", "take"]
