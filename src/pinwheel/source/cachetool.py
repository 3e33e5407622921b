"""``pinwheel cache``: what the cache holds, whether it is sound, and freeing it.

The cache (``--cache``, default ``~/.cache/pinwheel``) reaches several GB:
``repos/`` (one bare repository per upstream URL), ``toolchains/``, ``venvs/``,
``sccache/`` and whatever later stages add. Each function returns a frozen
outcome; the CLI prints it. Nothing here removes ``locks/`` (another run may
hold one), and :func:`clean` and :func:`prune` only remove with ``apply=True``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel.errors import PinwheelError, UsageError
from pinwheel.manifest import Manifest
from pinwheel.source import gitcli
from pinwheel.source.cache import slug

KEEP = ("locks",)


@dataclass(frozen=True)
class Usage:
    name: str  # top-level entry under the cache, e.g. "repos"
    bytes: int
    files: int


@dataclass(frozen=True)
class DiskUsage:
    root: Path
    entries: tuple[Usage, ...]

    @property
    def total(self) -> int:
        return sum(e.bytes for e in self.entries)


@dataclass(frozen=True)
class RepoCheck:
    path: Path
    ok: bool
    detail: str  # git fsck's complaint, or "ok"


@dataclass(frozen=True)
class Removal:
    root: Path
    paths: tuple[Path, ...]
    bytes: int
    applied: bool  # False: dry run, nothing removed


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _size(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path``; symlinks are counted, not followed."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size, 1
    total = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
            except FileNotFoundError:
                continue
    return total, files


def disk_usage(root: Path) -> DiskUsage:
    root = Path(root)
    entries = []
    if root.is_dir():
        for child in sorted(root.iterdir()):
            size, files = _size(child)
            entries.append(Usage(child.name, size, files))
    return DiskUsage(root, tuple(entries))


def repos(root: Path) -> tuple[Path, ...]:
    base = Path(root) / "repos"
    return tuple(sorted(p for p in base.glob("*.git") if p.is_dir())) if base.is_dir() else ()


def verify(root: Path, *, full: bool = False) -> tuple[RepoCheck, ...]:
    """``git fsck`` each cache repository (``--connectivity-only`` unless ``full``)."""
    checks = []
    for repo in repos(root):
        args = ["fsck", "--no-dangling", "--no-progress"]
        if not full:
            args.insert(1, "--connectivity-only")
        try:
            proc = gitcli.git(args, git_dir=repo, check=False)
        except PinwheelError as exc:  # classified faults (corruption) raise: record them
            checks.append(RepoCheck(repo, False, exc.what))
            continue
        text = (proc.stderr + proc.stdout).decode(errors="replace")
        problems = [
            ln.strip()
            for ln in text.splitlines()
            if ln.strip() and not ln.startswith("notice:")  # unborn HEAD of a bare cache repo
        ]
        if _partial_alternate(repo):
            # Blobs a partial (promisor) mirror never had are expected, not damage.
            problems = [ln for ln in problems if not ln.startswith("missing blob")]
        if problems or (proc.returncode != 0 and not _partial_alternate(repo)):
            checks.append(RepoCheck(repo, False, problems[0] if problems else "fsck failed"))
        else:
            checks.append(RepoCheck(repo, True, "ok"))
    return tuple(checks)


def _partial_alternate(repo: Path) -> bool:
    alternates = repo / "objects" / "info" / "alternates"
    if not alternates.is_file():
        return False
    for line in alternates.read_text().split():
        if any((Path(line) / "pack").glob("*.promisor")):
            return True
    return False


def _remove(root: Path, paths: Sequence[Path], apply: bool) -> Removal:
    size = sum(_size(p)[0] for p in paths)
    if apply:
        for p in paths:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
    return Removal(Path(root), tuple(paths), size, apply)


def clean(root: Path, *, apply: bool) -> Removal:
    """Everything under the cache except ``locks/``."""
    root = Path(root)
    paths = [p for p in sorted(root.iterdir()) if p.name not in KEEP] if root.is_dir() else []
    return _remove(root, paths, apply)


def _last_used(repo: Path) -> float:
    stamps = [repo.stat().st_mtime]
    for name in ("FETCH_HEAD", "packed-refs", "refs", "objects", "HEAD"):
        p = repo / name
        if p.exists():
            stamps.append(p.stat().st_mtime)
    return max(stamps)


def prune(
    root: Path,
    manifests: Sequence[Manifest],
    *,
    older_than_days: float | None,
    apply: bool,
    now: float | None = None,
) -> Removal:
    """Cache repositories no given manifest uses, and (with ``older_than_days``) not used since.

    Without manifests only age counts; without either, nothing is selected.
    """
    if not manifests and older_than_days is None:
        raise UsageError(
            "prune needs manifests to keep, --older-than DAYS, or both",
            where="pinwheel cache prune",
            next="pinwheel cache prune manifest.toml --older-than 30",
        )
    keep = set()
    for m in manifests:
        keep.add(f"{slug(m.upstream.url)}.git")
        for k in m.kernels:
            if k.url:
                keep.add(f"{slug(k.url)}.git")
    cutoff = (now or time.time()) - older_than_days * 86400 if older_than_days else None
    chosen = [
        repo
        for repo in repos(root)
        if repo.name not in keep and (cutoff is None or _last_used(repo) < cutoff)
    ]
    return _remove(root, chosen, apply)
