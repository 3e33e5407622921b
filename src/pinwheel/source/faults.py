"""Name machine faults for what they are: a full disk, a corrupt cache object.

git and libgit2 report both as ordinary failures, and the callers that read
those failures (a patch that does not apply, a fetch that failed, an object
missing from a partial mirror) would otherwise blame the manifest, the network
or the mirror. Every git CLI run and every libgit2 error in ``source/`` passes
through :func:`classify` first.
"""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

from pinwheel.errors import PinwheelError
from pinwheel.fsutil import free_space
from pinwheel.printable import shown_cmd

_DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded|ENOSPC|EDQUOT", re.I)
_CORRUPT = re.compile(
    r"failed to inflate|inflate: data stream error|is corrupt|corrupt loose object|"
    r"bad object header|unable to unpack .* header|object file .* is empty|hash mismatch|"
    r"packfile .* does not match index|invalid object type|failed to parse (loose )?object|"
    r"object corrupt|loose object .* is corrupt|bad packed object CRC",
    re.I,
)


# Below this much free space a write that failed without a reason is taken as disk full
# (libgit2 may drop a loose object on ENOSPC and still return its id).
LOW_SPACE = 1024 * 1024


def low_space(path: Path) -> bool:
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free < LOW_SPACE
    except OSError:
        return False


def write_failed(repo: Path, what: str) -> PinwheelError:
    """libgit2 returned an id for an object it did not store."""
    if low_space(repo):
        return disk_full(repo, f"libgit2 could not store {what}")
    return PinwheelError(
        f"libgit2 could not store {what} in the cache repository",
        where=str(repo),
        next=f"check that {repo} is writable and `pinwheel cache verify` passes, then run again",
    )


def disk_full(path: Path, detail: str = "") -> PinwheelError:
    return PinwheelError(
        f"disk full: no space left writing under {path} ({free_space(path)} free)"
        + (f": {detail}" if detail else ""),
        where=str(path),
        next="free space (`pinwheel cache du` shows what the cache holds; "
        "`pinwheel cache prune` or `pinwheel cache clean --yes` frees it), then run again",
    )


def corrupt(repo: Path, detail: str) -> PinwheelError:
    return PinwheelError(
        f"cache corruption: an object in {repo} cannot be read ({detail})",
        where=str(repo),
        next=f"`pinwheel cache verify` names the damaged repositories; remove this one "
        f"(`{shown_cmd('rm', '-rf', '--', repo)}`) and run again: it is re-fetched",
    )


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return bool(_DISK_FULL.search(str(exc)))


def classify(text: str, path: Path) -> PinwheelError | None:
    """A disk-full or corruption error for git/libgit2 output ``text``, else None."""
    if _DISK_FULL.search(text):
        last = [ln for ln in text.strip().splitlines() if _DISK_FULL.search(ln)]
        return disk_full(path, last[-1].strip() if last else "")
    if _CORRUPT.search(text):
        last = [ln for ln in text.strip().splitlines() if _CORRUPT.search(ln)]
        return corrupt(path, last[-1].strip() if last else text.strip())
    return None


def classify_exception(exc: BaseException, path: Path) -> PinwheelError | None:
    """The same for an exception raised by libgit2 (pygit2.GitError) or the OS."""
    if is_disk_full(exc):
        where = Path(exc.filename) if isinstance(exc, OSError) and exc.filename else path
        return disk_full(where, str(exc))
    return classify(str(exc), path)
