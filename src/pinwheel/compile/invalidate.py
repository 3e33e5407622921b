"""Tell a kept build tree what changed, when file times cannot.

Every exported source carries one fixed mtime (:data:`pinwheel.compile.workspace.SOURCE_MTIME`):
compilers write source mtimes into their output (ptxas with ``-lineinfo`` puts
each ``.file``'s mtime in the cubin's ``.debug_line``; gcc's ``__TIMESTAMP__``),
so real export times made two builds of one tree differ. With the times fixed,
ninja and setuptools can no longer see a change, so pinwheel, which knows exactly
which files it rewrote, removes what depended on them before the builder runs:

- each ninja build directory under the build trees (one with ``.ninja_deps``):
  ``ninja -t deps`` names every object's inputs as the compiler reported them;
  an object that read a changed or removed file is deleted, so ninja rebuilds it
  (and everything linked from it);
- setuptools' copies (``build/lib*``, ``build/bdist.*``), which it refreshes only
  when the source is newer, are deleted whole (the link and copies redo in seconds);
- a changed build file (setup.py, CMakeLists.txt, *.cmake ...), a ninja directory
  whose deps cannot be read, or no ninja at all: the build trees are wiped (a
  cold build of the kept export; never a stale object).

In: the build trees, the export's spellings (real and canonical), the changed
paths, the build environment's PATH. Out: an :class:`Invalidated` saying what went.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel import runner
from pinwheel.compile.reuse import is_build_file
from pinwheel.fsutil import remove_tree

SETUPTOOLS_COPIES = ("lib", "lib.*", "bdist.*")
# A changed file with one of these suffixes that no recorded dependency names may still
# be compiled (its rule keeps no deps): the tree is rebuilt rather than trusted.
SOURCE_SUFFIXES = frozenset(
    ".c .cc .cpp .cxx .cu .cuh .h .hh .hpp .hxx .inc .inl .ipp .tcc .S .s .ptx".split()
)


@dataclass(frozen=True)
class Invalidated:
    """What a kept build tree lost so the builder redoes exactly what changed."""

    objects: tuple[str, ...] = ()  # ninja outputs deleted (relative to their build dir)
    copies: tuple[str, ...] = ()  # setuptools copy directories deleted
    wiped: tuple[str, ...] = ()  # build trees wiped whole
    why: str | None = None  # why they were wiped

    def summary(self) -> str:
        if self.wiped:
            return f"build tree rebuilt from scratch ({self.why})"
        return f"{len(self.objects)} object(s) to recompile"


def _ninja_dirs(trees: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for tree in trees:
        if tree.is_dir():
            found += sorted(p.parent for p in tree.rglob(".ninja_deps"))
    return found


def parse_deps(text: str) -> dict[str, list[str]]:
    """``ninja -t deps`` output: {output: [inputs as recorded]}."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            current = None
        elif not line[0].isspace() and ": #deps " in line:
            current = out.setdefault(line.split(": #deps ", 1)[0], [])
        elif current is not None:
            current.append(line.strip())
    return out


def _changed_spellings(
    changed: Iterable[str], roots: Sequence[str | os.PathLike[str]]
) -> frozenset[str]:
    return frozenset(
        os.path.normpath(os.path.join(os.fspath(root), rel)) for rel in changed for root in roots
    )


def invalidate(
    trees: Sequence[Path],
    changed: Sequence[str],
    *,
    roots: Sequence[str | os.PathLike[str]],
    path: str,
    build_dir_spellings: Sequence[tuple[Path, str]] = (),
) -> Invalidated:
    """Remove from ``trees`` what was built from any of ``changed`` (paths relative to the
    export, spelled under any of ``roots``). ``path``: PATH to find ninja on;
    ``build_dir_spellings``: (real, as the build saw it) for relative deps."""
    if not changed:
        return Invalidated()
    build_files = sorted(rel for rel in changed if is_build_file(rel))
    if build_files:
        return wipe(trees, f"build file changed: {', '.join(build_files[:3])}")
    dirs = _ninja_dirs(trees)
    if not dirs:
        if any(t.is_dir() and any(t.iterdir()) for t in trees):
            return wipe(trees, "no ninja dependencies to tell what the change reaches")
        return Invalidated()
    ninja = shutil.which("ninja", path=path)
    if ninja is None:
        return wipe(trees, "no ninja to read the build's dependencies")
    hit = _changed_spellings(changed, roots)
    removed: list[str] = []
    found: set[str] = set()
    for directory in dirs:
        out = runner.run(
            runner.Command((ninja, "-C", str(directory), "-t", "deps"), check=False)
        )
        if not out.ok:
            return wipe(trees, f"ninja -t deps failed in {directory.name}")
        seen_as = [str(directory)] + [
            os.path.join(canon, os.path.relpath(directory, real))
            for real, canon in build_dir_spellings
            if _under(directory, real)
        ]
        for output, inputs in parse_deps(out.text).items():
            paths = {os.path.normpath(os.path.join(base, i)) for i in inputs for base in seen_as}
            found |= paths & hit
            if paths & hit:
                target = _real(output, directory, build_dir_spellings)
                if target is None:
                    return wipe(trees, f"cannot place ninja output {output} on this machine")
                if target.exists():
                    target.unlink()
                    removed.append(os.path.relpath(target, directory))
    unread = [
        rel for rel in changed
        if Path(rel).suffix in SOURCE_SUFFIXES and not _changed_spellings([rel], roots) & found
    ]  # fmt: skip
    if unread:
        return wipe(trees, f"no recorded dependency names {unread[0]} (it may compile)")
    copies: list[str] = []
    for tree in trees:
        for pattern in SETUPTOOLS_COPIES:
            for copy in sorted(tree.glob(pattern)) if tree.is_dir() else ():
                if copy.is_dir():
                    remove_tree(copy)
                    copies.append(copy.name)
    return Invalidated(tuple(removed), tuple(copies))


def _real(output: str, directory: Path, spellings: Sequence[tuple[Path, str]]) -> Path | None:
    """Where ninja's ``output`` is here: relative to its directory, or absolute as the build
    saw it (the canonical path inside the namespace) and translated back; None if neither."""
    if not os.path.isabs(output):
        return directory / output
    for real, seen in spellings:
        if output == seen or output.startswith(seen.rstrip("/") + "/"):
            return Path(real) / os.path.relpath(output, seen)
    here = Path(output)
    return here if _under(here, directory) else None


def after_update(
    trees: Sequence[Path],
    changed: Sequence[str],
    *,
    roots: Sequence[str | os.PathLike[str]],
    path: str,
    build_dir_spellings: Sequence[tuple[Path, str]] = (),
    interrupted: bool = False,
    changed_sources: Sequence[str] = (),
) -> Invalidated:
    """What a kept build tree loses after its export was updated in place: all of it when
    an earlier update was ``interrupted`` before this step or a build source changed
    (``changed_sources``), else what :func:`invalidate` finds ``changed`` reached."""
    if interrupted:
        return wipe(trees, "an earlier build stopped between updating the export and the tree")
    if changed_sources:
        return wipe(trees, f"build source changed: {', '.join(changed_sources)}")
    return invalidate(
        trees, changed, roots=roots, path=path, build_dir_spellings=build_dir_spellings
    )


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def wipe(trees: Sequence[Path], why: str) -> Invalidated:
    """Remove the build trees whole (the kept export stays): a cold build of it."""
    wiped = []
    for tree in trees:
        if tree.exists():
            remove_tree(tree)
            wiped.append(tree.name)
    return Invalidated(wiped=tuple(wiped), why=why)


__all__ = ["Invalidated", "after_update", "invalidate", "parse_deps", "wipe"]
