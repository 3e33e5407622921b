"""Headers pinwheel did not install, seen by the build with one fixed mtime.

ptxas with ``-lineinfo`` writes the mtime of every file that holds device code
into the cubin's line table: the export's sources (fixed by the workspace), the
headers of a provisioned toolkit (its archive's member times) and of a torch venv
pinwheel made (fixed when it is made) -- and, until this module, the headers of
a toolkit or a Python that the machine brought (``CUDA_HOME=/usr/local/cuda``,
``PINWHEEL_TORCH_PYTHON``): their install times, so the same sources gave other
bytes on a machine whose image was made at another time.

pinwheel never touches those files. It keeps a copy of each such ``include``
directory under ``<cache>/headers/<key>`` (key: every file's path, size, mode and
mtime; made once, atomically) whose files all carry :data:`SOURCE_MTIME`, and the
build's mount namespace binds the copy over the original path
(:meth:`pinwheel.compile.canonical.Canonical.with_views`). Without a namespace
(prefix maps) no view applies and provenance says the headers keep their times.

In: the directories and the cache. Out: :class:`View` (copy, the path it covers).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from pinwheel.compile import workers
from pinwheel.compile.workspace import SOURCE_MTIME
from pinwheel.fsutil import remove_tree

READY = ".pinwheel-view"


@dataclass(frozen=True)
class View:
    """``copy`` (in the cache, fixed times) bound over ``covers`` (the original, as the
    build names it) inside the build's namespace."""

    copy: Path
    covers: Path

    @property
    def files(self) -> int:
        """Entries of the copy (its marker aside): counted when asked, not on every build."""
        return sum(1 for _ in self.copy.rglob("*")) - 1


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of everything under ``root``, sorted; links not followed.

    Each directory's entries by name, then its subdirectories in that order (``os.walk``
    top-down, sorted). Run on every build for each view (torch's headers are thousands of
    files), so on strings and ``scandir`` entries, not ``pathlib``."""
    out: list[tuple[str, os.stat_result]] = []
    pending = [(str(root), "")]
    while pending:
        path, rel = pending.pop()
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:  # as os.walk: an unreadable directory is skipped
            continue
        subdirs = []
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            out.append((rel + entry.name, st))
            if stat.S_ISDIR(st.st_mode):
                subdirs.append((entry.path, rel + entry.name + "/"))
        pending.extend(reversed(subdirs))
    return out


def key_of(root: Path) -> str:
    """What the copy depends on: each entry's path, kind, size, mode and mtime."""
    h = hashlib.sha256(str(root).encode() + b"\0")
    for rel, st in _walk(root):
        h.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{st.st_size}\0{st.st_mode}\0".encode())
        h.update(f"{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def make(root: Path, cache: Path, mtime: int = SOURCE_MTIME) -> View:
    """The fixed-time copy of ``root`` in ``cache`` (made once; a half-made one is redone)."""
    root = Path(root)
    key = key_of(root)
    final = cache / "headers" / key
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final.parent / f".{key}.lock")):  # another build may be making it
        if not (final / READY).is_file():
            tmp = final.with_name(f".{key}.part-{os.getpid()}")
            remove_tree(tmp, ignore_errors=True)
            shutil.copytree(root, tmp, symlinks=True)
            _fix_times(tmp, mtime)
            (tmp / READY).write_text(f"{root}\n")  # last: a copy without it is redone
            remove_tree(final, ignore_errors=True)
            tmp.rename(final)
    return View(copy=final, covers=root)


def _fix_times(root: Path, mtime: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            os.utime(Path(dirpath) / name, (mtime, mtime), follow_symlinks=False)
    os.utime(root, (mtime, mtime))


# Asked of the build's Python without importing torch: where torch and the nvidia wheels lie.
def torch_include_dirs(python: Path) -> list[Path]:
    """The header directories a torch extension reads from ``python``'s packages: torch's own
    ``include`` and the nvidia wheels' ``nvidia/*/include`` (asked of ``python``: no import)."""
    from pinwheel import runner

    out = runner.run(
        runner.Command((str(python), "-c", workers.source("find_headers")), timeout=60, check=False)
    )
    if out.returncode != 0:
        return []
    found: list[Path] = []
    for line in out.text.splitlines():
        name, _, loc = line.partition("\t")
        if name == "torch":
            found += [p for p in (Path(loc) / "include",) if p.is_dir()]
        elif name == "nvidia":
            found += sorted(p for p in Path(loc).glob("*/include") if p.is_dir())
    return found


def toolkit_include_dirs(toolkit: Path) -> list[Path]:
    """A CUDA toolkit's header directories (``include`` is often a link into ``targets/``)."""
    out: list[Path] = []
    for candidate in (toolkit / "include", *sorted(toolkit.glob("targets/*/include"))):
        real = candidate.resolve()
        if real.is_dir() and real not in out:
            out.append(real)
    return out


def outside(dirs: Iterable[Path], *insides: Path) -> list[Path]:
    """``dirs`` that lie under none of ``insides`` (what pinwheel made already has fixed times)."""
    keep: list[Path] = []
    for d in dirs:
        real = Path(d).resolve()
        if any(real == i or i in real.parents for i in (p.resolve() for p in insides)):
            continue
        if real not in keep:
            keep.append(real)
    return keep
