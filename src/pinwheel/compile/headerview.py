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

Paths too: :func:`prefix_maps` names, for the build Python's own include directory and
the torch (and nvidia) header directories of a Python outside the cache, the canonical
name the compilers write instead (``-ffile-prefix-map``, every method), so a machine's
interpreter or torch location never reaches an object's ``__FILE__`` or debug paths.

In: the directories and the cache. Out: :class:`View` (copy, the path it covers), and
(real, canonical) pairs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pinwheel import cachelayout, confine, locking
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
    final = cachelayout.bucket(cache, "headers") / key
    confine.folder_in_cache(cache, "headers", what="header views folder")  # no link
    with locking.held(final.parent / f".{key}.lock"):  # another build may be making it
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


_INCLUDE_PROBE = (
    "import json, sysconfig\n"
    "p = sysconfig.get_paths()\n"
    "print(json.dumps([p.get('include'), p.get('platinclude')]))"
)


def python_include_dirs(python: Path) -> list[str]:
    """``python``'s own C include directories (``Python.h``; include and platinclude), as it
    names them to a build (sysconfig; ``-I``: no PYTHONPATH, no site)."""
    import json

    from pinwheel import runner

    out = runner.run(
        runner.Command((str(python), "-I", "-c", _INCLUDE_PROBE), timeout=60, check=False)
    )
    try:
        found = json.loads(out.text.splitlines()[-1]) if out.returncode == 0 else []
    except (ValueError, IndexError):
        found = []
    dirs = [d for d in found if isinstance(d, str) and d] if isinstance(found, list) else []
    return list(dict.fromkeys(dirs))


def prefix_maps(
    pythons: Iterable[Path], root: Path, *insides: Path
) -> tuple[tuple[str, str], ...]:
    """(directory as the build names it, canonical name) for each Python's include
    directories (under ``<root>/python/``; ``root``: canonical.CANONICAL_ROOT, given by the
    caller: canonical imports this module) and torch's and the nvidia wheels' header
    directories (under ``<root>/site-packages/``), leaving out what lies under ``insides``
    (the cache: already canonical). Both spellings of a linked directory are mapped.

    Each path is checked (:func:`pinwheel.validate.prefix_map_path`): one the option cannot
    carry is a :class:`pinwheel.errors.PinwheelError` naming the Python."""
    from pinwheel import validate
    from pinwheel.errors import PinwheelError

    inside = [Path(p).resolve() for p in insides]

    def under(path: Path) -> bool:
        return any(path == i or i in path.parents for i in inside)

    pairs: dict[str, str] = {}
    for python in dict.fromkeys(Path(p) for p in pythons):
        named = [(d, root / "python" / f"include{i or ''}")
                 for i, d in enumerate(python_include_dirs(python))]  # fmt: skip
        for d in torch_include_dirs(python):  # <site>/torch/include, <site>/nvidia/X/include
            site = d.parent.parent if d.parent.name == "torch" else d.parent.parent.parent
            named.append((str(d), root / "site-packages" / d.relative_to(site)))
        for given, canon in named:
            for spelling in dict.fromkeys((given, os.path.realpath(given))):
                if under(Path(spelling).resolve()) or under(Path(spelling)):
                    continue
                try:
                    validate.prefix_map_path(spelling)
                except ValueError as exc:
                    raise PinwheelError(
                        f"the build Python's header directory cannot be given a canonical "
                        f"name: {exc}",
                        where=str(python),
                        next="use a Python (PINWHEEL_BUILD_PYTHON, PINWHEEL_TORCH_PYTHON) "
                        "installed at a plain path",
                    ) from None
                pairs.setdefault(spelling, str(canon))
    # gcc tries the last -ffile-prefix-map first: the longest (most specific) goes last.
    return tuple(sorted(pairs.items(), key=lambda p: (len(p[0]), p[0])))


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
