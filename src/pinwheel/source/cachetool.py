"""``pinwheel cache``: what the cache holds, whether it is sound, and freeing it.

The cache (``--cache``, default ``~/.cache/pinwheel``) reaches several GB:
``repos/`` (one bare repository per upstream URL), ``toolchains/``, ``venvs/``,
``sccache/`` and whatever later stages add. Each function returns a frozen
outcome; the CLI prints it. Nothing here removes ``locks/`` (another run may
hold one), and :func:`clean` and :func:`prune` only remove with ``apply=True``.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel import cachelayout, confine, locking, untrusted
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.manifest import Manifest
from pinwheel.source import cache, gitcli
from pinwheel.source.cache import slug

# Never removed by `cache clean` (another run may hold a lock; the marker says what this
# is): the cache layout's own table says which.
KEEP = cachelayout.kept_by_clean()


@dataclass(frozen=True)
class Usage:
    name: str  # an entry under the cache ("repos"), or under a top-level folder of it
    bytes: int
    files: int  # every entry that is not a folder: files, links, FIFOs...
    # For a top-level folder: each entry directly under it, largest first.
    children: tuple[Usage, ...] = ()
    links: int = 0  # symlinks among ``files``: counted, never followed
    special: int = 0  # FIFOs, sockets, devices among ``files``: counted, never opened
    unreadable: int = 0  # folders that could not be listed
    folder: bool = False
    shared: int = 0  # bytes of hard links to files counted before (in ``bytes`` there, not here)

    @classmethod
    def of(
        cls, name: str, t: confine.Tally, children: tuple[Usage, ...] = (), *, folder: bool
    ) -> Usage:
        return cls(name, t.bytes, t.files + t.links + t.special, children, t.links, t.special,
                   t.unreadable, folder, t.shared)  # fmt: skip

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"bytes": self.bytes, "files": self.files, "folder": self.folder}
        for key in ("links", "special", "unreadable", "shared"):
            if getattr(self, key):
                doc[key] = getattr(self, key)
        return doc


@dataclass(frozen=True)
class DiskUsage:
    root: Path
    entries: tuple[Usage, ...]  # largest first

    @property
    def total(self) -> int:
        return sum(e.bytes for e in self.entries)


def _largest_first(items: Sequence[Usage]) -> tuple[Usage, ...]:
    return tuple(sorted(items, key=lambda u: (-u.bytes, u.name)))


@dataclass(frozen=True)
class KnownMissing:
    """An object a partial (promisor) mirror never had: expected, not damage."""

    object: str  # its id
    kind: str  # "blob", "tree", ...
    path: str  # where a cached ref's tree names it ("" when no cached ref does)


@dataclass(frozen=True)
class RepoCheck:
    path: Path
    ok: bool
    detail: str  # git fsck's complaint, or "ok"
    known_missing: tuple[KnownMissing, ...] = ()  # a partial mirror's absent objects

    @property
    def partial(self) -> bool:
        return bool(self.known_missing)


@dataclass(frozen=True)
class Removal:
    root: Path
    paths: tuple[Path, ...]
    bytes: int
    applied: bool  # False: dry run, nothing removed
    busy: tuple[Path, ...] = ()  # repositories another run holds the lock of: kept


def _size(path: Path) -> tuple[int, int]:
    """(bytes, entries that are not folders) under ``path``; links counted, not followed;
    any depth (:func:`pinwheel.confine.tally_at`)."""
    path = Path(path)
    try:
        fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        return 0, 0
    try:
        t = confine.tally_at(fd, path.name, where=str(path))
    finally:
        os.close(fd)
    return t.bytes, t.files + t.links + t.special


def disk_usage(root: Path) -> DiskUsage:
    """Each top-level entry of the cache and, for a folder, each entry directly under it,
    counted by :mod:`pinwheel.confine` (no link followed, no FIFO opened, any depth, each
    byte walked once); the largest first. A top-level link is counted as a link. A file
    hard-linked in two places (a toolkit's ``-dev`` variant sharing the plain tree's files)
    is counted once, where the walk (sorted by name) meets it first, and as ``shared``
    after: the total is what the cache holds on disk."""
    root = Path(root)
    if not root.is_dir():
        return DiskUsage(root, ())
    entries = []
    seen: confine.Seen = set()
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for name in sorted(os.listdir(fd)):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                entries.append(Usage.of(name, confine.tally_at(fd, name, seen=seen),
                                        folder=False))  # fmt: skip
                continue
            try:
                kids = confine.tally_children(fd, name, where=str(root / name), seen=seen)
            except PermissionError:
                entries.append(Usage.of(name, confine.Tally(unreadable=1), folder=True))
                continue
            top = sum((t for _, _, t in kids), confine.Tally())
            below = _largest_first([Usage.of(n, t, folder=f) for n, f, t in kids])
            entries.append(Usage.of(name, top, below, folder=True))
    finally:
        os.close(fd)
    return DiskUsage(root, _largest_first(entries))


def repos(root: Path) -> tuple[Path, ...]:
    """The cache repositories, each checked to be inside the cache (``repos/`` or an entry
    that is a symlink out of the cache is refused, never followed)."""
    base = confine.inside(root, "repos", what="cache folder")
    if base.is_symlink() or not base.is_dir():
        if base.is_symlink():
            confine.inside(root, Path(base) / "x", what="cache folder")  # raises when it leads out
        else:
            return ()
    found = []
    for p in sorted(base.glob("*.git")):
        if p.is_symlink():
            continue  # never a cache repository: pinwheel makes real directories
        if p.is_dir():
            found.append(confine.inside(root, p, what="cache repository"))
    return tuple(found)


_BROKEN = re.compile(r"broken link from\s+(\w+) ([0-9a-f]{40,64})\s+to\s+(\w+) ([0-9a-f]{40,64})")
_MISSING = re.compile(r"missing (\w+) ([0-9a-f]{40,64})")


def verify(root: Path, *, full: bool = False) -> tuple[RepoCheck, ...]:
    """``git fsck`` each cache repository (``--connectivity-only`` unless ``full``).

    A partial (promisor) mirror attached as an alternate lacks some objects on
    purpose: an object missing because an object of a promisor pack names it is
    what the mirror never had (a re-fetch gives the same), reported as known and
    with its path, not as damage. Anything else missing or broken is damage.
    """
    return tuple(_verify_one(repo, full) for repo in repos(root))


# Files git reads at start-up: a FIFO or device there would hang `git fsck` (git opens
# it blocking); each is checked to be a regular file, within the cap, before git runs.
_GIT_FILE_CAP = 1 << 30  # a default: packed-refs of a large mirror is tens of MB
_GIT_FILES = ("HEAD", "config", "packed-refs", "FETCH_HEAD", "objects/info/alternates")


def _git_files_problem(repo: Path) -> str | None:
    for name in _GIT_FILES:
        path = repo / name
        if not os.path.lexists(path) and name != "HEAD":
            continue
        try:
            untrusted.regular_size(path, untrusted.GIT_FILE, cap=_GIT_FILE_CAP)
        except PinwheelError as exc:
            return f"{name}: {exc.what}"
    return None


def _verify_one(repo: Path, full: bool) -> RepoCheck:
    problem = _git_files_problem(repo)
    if problem:
        return RepoCheck(repo, False, problem)
    args = ["fsck", "--no-dangling", "--no-progress"]
    if not full:
        args.insert(1, "--connectivity-only")
    try:
        proc = gitcli.git(args, git_dir=repo, check=False)
    except PinwheelError as exc:  # classified faults (corruption) raise: record them
        return RepoCheck(repo, False, exc.what)
    text = (proc.stderr + proc.stdout).decode(errors="replace")
    # fsck prints "broken link from <kind> <id>" and "to <kind> <id>" on two lines.
    joined = re.sub(r"\n\s+to\s+", " to ", text)
    problems = [
        ln.strip()
        for ln in joined.splitlines()
        if ln.strip() and not ln.startswith("notice:")  # unborn HEAD of a bare cache repo
    ]
    promisor = _PromisorIndex(_promisor_packs(repo))
    known: dict[str, str] = {}  # missing object -> kind
    damage = []
    for line in problems:
        if m := _BROKEN.search(line):
            _kind, holder, kind, missing = m.groups()
            if promisor.has(holder):
                known[missing] = kind
                continue
        elif (m := _MISSING.search(line)) and m.group(2) in known:
            continue
        damage.append(line)
    # A "missing" line whose holder came later in the output: settle it now.
    damage = [ln for ln in damage if not ((m := _MISSING.search(ln)) and m.group(2) in known)]
    if damage or (proc.returncode != 0 and not known):
        return RepoCheck(repo, False, damage[0] if damage else "fsck failed")
    found = _paths_of(repo, set(known))
    missing = tuple(
        KnownMissing(obj, kind, found.get(obj, "")) for obj, kind in sorted(known.items())
    )
    return RepoCheck(repo, True, "ok", missing)


def _promisor_packs(repo: Path) -> list[Path]:
    """Index files of promisor packs in the repository and in its alternates."""
    dirs = [repo / "objects"]
    alternates = repo / "objects" / "info" / "alternates"
    if alternates.is_file():
        dirs += [Path(line) for line in alternates.read_text().split() if line]
    return [
        p.with_suffix(".idx")
        for d in dirs
        for p in sorted((d / "pack").glob("*.promisor"))
        if p.with_suffix(".idx").is_file()
    ]


class _PromisorIndex:
    """Membership in pack index files (version 2), read directly: fanout + sorted ids."""

    def __init__(self, indexes: Sequence[Path]) -> None:
        self._idx = [ix.read_bytes() for ix in indexes]

    def has(self, oid: str) -> bool:
        want = bytes.fromhex(oid)
        for data in self._idx:
            if data[:4] != b"\xfftOc" or int.from_bytes(data[4:8], "big") != 2:
                continue
            width = len(want)
            first = want[0]
            lo = (
                int.from_bytes(data[8 + 4 * (first - 1) : 12 + 4 * (first - 1)], "big")
                if first
                else 0
            )
            hi = int.from_bytes(data[8 + 4 * first : 12 + 4 * first], "big")
            base = 8 + 256 * 4
            while lo < hi:
                mid = (lo + hi) // 2
                got = data[base + mid * width : base + (mid + 1) * width]
                if got == want:
                    return True
                if got < want:
                    lo = mid + 1
                else:
                    hi = mid
        return False


def _paths_of(repo: Path, objects: set[str]) -> dict[str, str]:
    """Where the trees of the cache's refs name ``objects`` (first ref that does)."""
    if not objects:
        return {}
    found: dict[str, str] = {}
    refs = (
        gitcli.git(["for-each-ref", "--format=%(objectname)", "refs/"], git_dir=repo, check=False)
        .stdout.decode()
        .split()
    )
    seen: set[str] = set()
    for ref in refs:
        tree = (
            gitcli.git(
                ["rev-parse", "--verify", "-q", f"{ref}^{{tree}}"], git_dir=repo, check=False
            )
            .stdout.decode()
            .strip()
        )
        if not tree or tree in seen:
            continue
        seen.add(tree)
        listing = gitcli.git(["ls-tree", "-r", "-z", tree], git_dir=repo, check=False).stdout
        for entry in listing.split(b"\0"):
            meta, _, name = entry.partition(b"\t")
            parts = meta.split()
            if len(parts) == 3 and parts[2].decode() in objects:
                found.setdefault(parts[2].decode(), name.decode(errors="replace"))
        if len(found) == len(objects):
            break
    return found


def _repo_lock(root: Path, repo: Path) -> Path | None:
    """The lock file a run holds while it uses ``repo`` (``locks/<slug>.lock``), or None."""
    if repo.parent.name != "repos" or not repo.name.endswith(".git"):
        return None
    lock = confine.inside(root, Path("locks") / (repo.name[: -len(".git")] + ".lock"))
    confine.mkdirs(root, lock.parent)
    return lock


MOUNTINFO = Path("/proc/self/mountinfo")


def _mount_points() -> list[str]:
    """Every mount point of this process (Linux ``/proc/self/mountinfo``, its octal escapes
    undone); none where there is no such file."""
    try:
        text = MOUNTINFO.read_text(errors="replace")
    except OSError:
        return []
    points = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def _refuse_mounts(root: Path, paths: Sequence[Path]) -> None:
    """A mount point at or under a path to remove: refused before anything is removed
    (removing would delete the files of another file system, then fail on the mount)."""
    for point in _mount_points():
        for p in paths:
            real = os.path.realpath(p)
            if point == real or point.startswith(real.rstrip("/") + "/"):
                raise UsageError(
                    f"{point} is a mount point inside the cache: nothing was removed",
                    where=f"{p} under {root}",
                    next=f"unmount it (umount {point}) or move it out of the cache, then "
                    "run `pinwheel cache clean --yes` again",
                )


def _remove(root: Path, paths: Sequence[Path], apply: bool) -> Removal:
    root = Path(root)
    paths = [confine.inside(root, p, what="path to remove") for p in paths]
    if apply:
        _refuse_mounts(root, paths)
    size = sum(_size(p)[0] for p in paths)
    removed: list[Path] = []
    busy: list[Path] = []
    for p in paths:
        lock = _repo_lock(root, p)
        if not apply:
            removed.append(p)
            continue
        if lock is None:
            confine.remove(root, p)
            removed.append(p)
            continue
        # The same lock a run holds while it fetches, replays or exports from the repo.
        try:
            with locking.held(lock, timeout_s=0):
                confine.remove(root, p)
            removed.append(p)
        except locking.LockBusy:
            busy.append(p)
    if busy:
        size -= sum(_size(p)[0] for p in busy)
    return Removal(Path(os.path.realpath(root)), tuple(removed), size, apply, tuple(busy))


def clean(root: Path, *, apply: bool) -> Removal:
    """Everything under the cache except ``locks/`` and its marker; only a folder bearing
    pinwheel's marker (:func:`pinwheel.source.cache.mark`) is emptied."""
    root = Path(root)
    if root.is_dir() and not cache.is_marked(root):
        raise UsageError(
            f"{root} is not pinwheel's cache: it has no {cache.TAG} written by pinwheel",
            where="pinwheel cache clean --cache",
            next="check --cache / PINWHEEL_CACHE; a cache pinwheel made bears the marker "
            "(one made before the marker existed: run `pinwheel run` once with it)",
        )
    paths = [p for p in sorted(root.iterdir()) if p.name not in KEEP] if root.is_dir() else []
    if apply and (root / "repos").is_dir() and not (root / "repos").is_symlink():
        # Repositories one by one, each under its lock; then the rest.
        inner = list(repos(root))
        first = _remove(root, inner, apply)
        # repos/ itself goes too unless a busy repository is kept in it.
        rest = [p for p in paths if p.name != "repos" or not first.busy]
        second = _remove(root, rest, apply)
        return Removal(
            first.root,
            first.paths + second.paths,
            first.bytes + second.bytes,
            apply,
            first.busy,
        )
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
    if older_than_days is not None and not (0 <= older_than_days < float("inf")):
        raise UsageError(
            f"--older-than {older_than_days} is not an age: a number of days, 0 or more",
            where="pinwheel cache prune --older-than",
            next="pinwheel cache prune --older-than 30",
        )
    keep = set()
    for m in manifests:
        keep.add(f"{slug(m.upstream.url)}.git")
        for k in m.kernels:
            if k.url:
                keep.add(f"{slug(k.url)}.git")
    cutoff = None if older_than_days is None else (now or time.time()) - older_than_days * 86400
    chosen = [
        repo
        for repo in repos(root)
        if repo.name not in keep and (cutoff is None or _last_used(repo) < cutoff)
    ]
    return _remove(root, chosen, apply)
