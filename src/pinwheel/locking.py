"""The one file lock: ``flock(LOCK_EX)`` on a lock file, for every lock pinwheel takes.

The cache's repository locks (``locks/<slug>.lock``), a build's workspace, the build and
tool venvs, provisioned toolkits and header views are all taken here. The lock is the one
filelock's ``FileLock`` takes on the same file (the kernel's ``flock`` on a plain file
left in place), so a pinwheel of an earlier version, or anything else holding a
``FileLock`` there, and this module see each other held; it is taken without importing
filelock, whose import costs a warm `pinwheel run` a fifth of its time. The lock goes
with the descriptor: released on exit, or by the kernel when the holder is killed.

A lock file is opened without following a link, never blocking, and must be a regular
file: a symbolic link, a FIFO, a device, a socket or a directory planted at its path is
refused with an error naming it, never waited on or written through. Nothing is ever
written into a lock file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from pinwheel.errors import PinwheelError

POLL_S = 0.05  # a default, filelock 4.3.1's poll_interval: how often a waiter tries again
MODE = 0o666  # a default, filelock 4.3.1's: a new lock file's mode, before the umask
PROC_LOCKS = Path("/proc/locks")  # Linux: every lock the kernel holds, with its holder's pid
_PROC_LOCKS_CAP = 4 << 20  # a default: /proc/locks is read this far at most

# "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (a waiter's line has "->" after "1:")
_FLOCK_LINE = re.compile(
    r"\d+: FLOCK +ADVISORY +WRITE +(\d+) +([0-9a-f]+):([0-9a-f]+):(\d+) +0 +EOF"
)


class LockBusy(PinwheelError):
    """Another process held the lock for the whole wait."""


class NotALockFile(PinwheelError):
    """The lock's path is a link, FIFO, device, socket or directory: nothing is locked."""


def _refused(path: Path, mode: int) -> NotALockFile:
    from pinwheel import untrusted  # only on the way to a refusal
    from pinwheel.printable import shown_cmd

    return NotALockFile(
        f"the lock file is {untrusted.file_type(mode)}, not a regular file: nothing was locked",
        where=str(path),
        next=f"look at it (`{shown_cmd('ls', '-la', path)}`); pinwheel makes its lock files "
        "itself: move it out of the way, then run again",
    )


def _open(path: Path) -> int:
    """A descriptor of the regular lock file ``path`` (made when absent), or the refusal."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        pass
    else:  # a device is refused before open() reaches its driver
        if not stat.S_ISREG(before.st_mode):
            raise _refused(path, before.st_mode)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags, MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link planted after the look above
            raise _refused(path, stat.S_IFLNK) from None
        if exc.errno == errno.EISDIR:
            raise _refused(path, stat.S_IFDIR) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped in between the look and the open
        os.close(fd)
        raise _refused(path, mode)
    return fd


def holders(fd: int) -> tuple[int, ...]:
    """The pids the kernel lists as holding a ``flock`` on the file open as ``fd`` (from
    ``/proc/locks``); none where that is not readable or names none this namespace sees."""
    from pinwheel import untrusted  # only on the way to a refusal

    st = os.fstat(fd)
    try:
        data = untrusted.read_regular(PROC_LOCKS, _PROC_LOCKS_CAP)
    except OSError:
        return ()
    if not isinstance(data, bytes):
        return ()
    found = []
    for line in data.decode("ascii", "replace").splitlines():
        m = _FLOCK_LINE.fullmatch(line.strip())
        if m is None:
            continue
        pid, major, minor, inode = int(m[1]), int(m[2], 16), int(m[3], 16), int(m[4])
        if pid > 0 and (major, minor, inode) == (
            os.major(st.st_dev), os.minor(st.st_dev), st.st_ino
        ):
            found.append(pid)
    return tuple(sorted(set(found)))


def _busy(path: Path, fd: int, timeout_s: float, what: str, next: str) -> LockBusy:
    pids = ",".join(map(str, holders(fd)))
    return LockBusy(
        f"{what} for {timeout_s:g}s" + (f" (pid {pids})" if pids else ""),
        where=str(path),
        next=next + (f" (`ps -o pid,etime,args -p {pids}` shows who holds it)" if pids else ""),
    )


@contextlib.contextmanager
def held(
    path: Path,
    *,
    timeout_s: float | None = None,
    what: str = "another pinwheel run has held this lock",
    next: str = "wait for it to finish, then run again",
) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` (its folder must exist), waiting up to
    ``timeout_s`` (``None``: as long as it takes; ``0``: one try). A lock still held then
    is :class:`LockBusy`: "``what`` for N s", the lock file, who holds it where the kernel
    says, and ``next``; a lock path that is no regular file is :class:`NotALockFile`."""
    import fcntl

    path = Path(path)
    fd = _open(path)
    try:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _busy(path, fd, timeout_s or 0, what, next) from None
                time.sleep(POLL_S)
        yield
    finally:
        os.close(fd)
