"""A venv already held to its RECORDs, recognised again by its files' stat, not re-hashed.

:func:`pinwheel.compile.lockedvenv.python_inventory` hashes every file of a venv's
site-packages against its RECORD (a venv with torch: seconds). After a check that found
nothing wrong, a memo records one sha256 over every entry of the venv as that check
reads it: each entry's relative path and ``lstat`` (size, mtime_ns, inode, mode,
ctime_ns), folder by folder in name order (so each folder's listing is in it), walking
the venv's own folder, ``bin``, and everything under ``lib`` (site-packages included)
without following a link. The memo names no path: only that digest, how many entries,
the venv's path and the lock's sha256. The next check skips the hashing only when the
memo

- is a regular file read bounded with no link followed from the cache down
  (:mod:`pinwheel.untrusted`), of this format, for this venv's path and lock digest;
- is signed (HMAC-SHA256, :mod:`pinwheel.keyfile`) with the cache's own ``venv-memo``
  key, which only this user can read: whoever can write the cache but not read the key
  cannot make a memo pinwheel accepts;
- and its digest is the venv's now: no file or folder added, removed or renamed and
  every ``lstat`` field the same. A rewrite changes size or mtime, ``utime`` can set
  mtime back but never ctime, a replacement changes the inode.

Anything else (no key, no memo, another key's or an edited one, a link planted for it)
is a miss: the full check runs and, when it passes, writes a new memo. A memo is not
written when any entry's ctime is within :data:`RACY_NS` of the check's start (a file
changed while it was hashed, or within the clock's tick of it): the next check hashes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import cachelayout, confine, keyfile, untrusted, validate
from pinwheel.errors import PinwheelError

FORMAT = "pinwheel.venv-memo/1"
KEY_NAME = "venv-memo"  # <cache>/keys/venv-memo.key
_PURPOSE = "pinwheel venv memo"
FOLDER = f"{cachelayout.bucket(Path(), 'memo').name}/venv"  # <cache>/memo/venv/
RACY_NS = 2_000_000_000  # a default: entries changed this close to the check are not memoised
KIND = untrusted.Kind(
    "venv memo", 64 * untrusted.KiB, 4, PinwheelError,
    "nothing to do: the venv's files are hashed again",
)  # fmt: skip
_MAX_INT = 1 << 63


@dataclass(frozen=True)
class Scope:
    """Where a venv's memo is kept (the cache) and what it is for (the lock's sha256)."""

    cache: Path
    lock_sha256: str


@dataclass(frozen=True)
class Snapshot:
    """Every entry of a venv as a check reads it, as one sha256 over each entry's relative
    path and ``lstat`` fields (size, mtime_ns, inode, mode, ctime_ns), folder by folder in
    name order (so a folder's listing is in it: an entry added or removed changes it)."""

    sha256: str
    entries: int
    newest_ctime_ns: int


def snapshot(venv: Path, site: Path) -> Snapshot | None:
    """The venv's entries now: its own folder and ``bin`` (their entries), everything under
    ``lib`` (recursively); no link is followed. None when ``site`` (the site-packages the
    check reads) is not a folder reached without a link: such a venv is never memoised."""
    venv = Path(venv)
    digest = hashlib.sha256()
    count, newest = 0, 0
    folders: set[str] = set()

    def add(rel: str, st: os.stat_result) -> None:
        nonlocal count, newest
        digest.update(b"%s\0%d %d %d %d %d\n" % (
            os.fsencode(rel), st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_ctime_ns,
        ))  # fmt: skip
        count += 1
        newest = max(newest, st.st_ctime_ns)

    def listing(rel: str, deep: bool) -> None:
        try:
            with os.scandir(venv / rel) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError:
            digest.update(b"%s\0unreadable\n" % os.fsencode(rel))
            return
        folders.add(rel)
        digest.update(b"%s\0%d entries\n" % (os.fsencode(rel), len(found)))
        for e in found:
            sub = e.name if rel == "." else f"{rel}/{e.name}"
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                digest.update(b"%s\0gone\n" % os.fsencode(sub))
                continue
            add(sub, st)
            if deep and stat.S_ISDIR(st.st_mode):
                listing(sub, True)

    try:
        top = os.lstat(venv)
    except OSError:
        return None
    if not stat.S_ISDIR(top.st_mode):
        return None
    add(".", top)
    listing(".", False)
    for rel, deep in (("bin", False), ("lib", True)):
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(venv / rel).st_mode):
                listing(rel, deep)
    try:
        site_rel = Path(site).relative_to(venv).as_posix()
    except ValueError:
        return None
    if site_rel not in folders:  # reached through a link, or not there: not memoised
        return None
    return Snapshot(digest.hexdigest(), count, newest)


def _rel(venv: Path, lock_sha256: str) -> str:
    where = json.dumps([os.fsdecode(os.path.abspath(venv)), lock_sha256])
    return f"{FOLDER}/{hashlib.sha256(where.encode()).hexdigest()}.json"


def path(scope: Scope, venv: Path) -> Path:
    """Where the memo of ``venv`` for ``scope``'s lock lives: ``<cache>/memo/venv/``, named
    by the sha256 of the venv's absolute path and the lock's sha256."""
    return Path(scope.cache) / _rel(venv, scope.lock_sha256)


def _key(cache: Path) -> bytes | None:
    try:
        return keyfile.cache_key(cache, KEY_NAME)
    except keyfile.NoKey:
        return None


def _payload(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def load(scope: Scope, venv: Path) -> tuple[Snapshot | None, str]:
    """The memo of ``venv`` for ``scope``'s lock when this cache's key signed it, else
    (None, why it is not used)."""
    key = _key(scope.cache)
    if key is None:
        return None, "no usable venv-memo key in the cache"
    rel = _rel(venv, scope.lock_sha256)
    try:
        raw = untrusted.read_beneath(Path(scope.cache), rel, KIND)
        doc = untrusted.parse_json(raw, KIND, f"{scope.cache}/{rel}")
    except (PinwheelError, OSError):
        if not os.path.lexists(Path(scope.cache) / rel):  # only for the note's words
            return None, "no memo of an earlier check"
        return None, "the memo is unreadable, too large or not a regular file"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None, "the memo is of another format"
    body = {k: v for k, v in doc.items() if k != "signature"}
    if not keyfile.signed(key, _PURPOSE, _payload(body), doc.get("signature")):
        return None, "the memo is not signed with this cache's key"
    if doc.get("venv") != os.fsdecode(os.path.abspath(venv)) or doc.get(
        "lock_sha256"
    ) != scope.lock_sha256:
        return None, "the memo is of another venv or lock"
    entries, newest = doc.get("entries"), doc.get("newest_ctime_ns")
    if not validate.is_sha256(doc.get("sha256")) or any(
        type(v) is not int or not 0 <= v < _MAX_INT for v in (entries, newest)
    ):
        return None, "the memo is malformed"
    return Snapshot(str(doc["sha256"]), int(str(entries)), int(str(newest))), ""


def unchanged(scope: Scope, venv: Path, site: Path) -> tuple[bool, str]:
    """Whether ``venv`` is, entry for entry, what its signed memo recorded: (True, "") or
    (False, why the files must be hashed)."""
    memo, why = load(scope, venv)
    if memo is None:
        return False, why
    now = snapshot(venv, site)
    if now is None:
        return False, "its site-packages is not a folder reached without a link"
    if now.sha256 != memo.sha256:
        return False, (f"an entry of the venv was added, removed or changed since its last "
                       f"check ({now.entries} entries now, {memo.entries} then)")  # fmt: skip
    return True, ""


def save(scope: Scope, venv: Path, site: Path, begun_ns: int) -> bool:
    """Record ``venv`` as it is now, signed, after a check (begun at ``begun_ns``,
    ``time.time_ns()``) found its files to be their RECORDs. Not written (False) when there
    is no key, the venv cannot be walked without a link, or an entry changed within
    :data:`RACY_NS` of the check's start."""
    key = _key(scope.cache)
    now = snapshot(venv, site)
    if key is None or now is None or now.newest_ctime_ns >= begun_ns - RACY_NS:
        return False
    body = {
        "format": FORMAT,
        "venv": os.fsdecode(os.path.abspath(venv)),
        "lock_sha256": scope.lock_sha256,
        "sha256": now.sha256,
        "entries": now.entries,
        "newest_ctime_ns": now.newest_ctime_ns,
    }
    doc = {**body, "signature": keyfile.sign(key, _PURPOSE, _payload(body))}
    try:  # every folder from the cache down opened O_NOFOLLOW; a link there is replaced
        confine.write_beneath(Path(scope.cache), _rel(venv, scope.lock_sha256),
                              json.dumps(doc, sort_keys=True).encode())  # fmt: skip
    except (confine.Escape, OSError):  # a memo only saves time
        return False
    return True


__all__ = ["FORMAT", "KEY_NAME", "RACY_NS", "Scope", "Snapshot", "load", "path", "save", "snapshot",
           "unchanged"]  # fmt: skip
