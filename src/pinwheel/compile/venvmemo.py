"""A venv already held to its RECORDs, recognised again by its files' stat, not re-hashed.

:func:`pinwheel.compile.lockedvenv.python_inventory` hashes every file of a venv's
site-packages against its RECORD (a venv with torch: seconds). After a check that found
nothing wrong, a memo records, for every entry of the venv as that check reads it, its
``lstat`` (size, mtime_ns, inode, mode, ctime_ns) and every folder's listing: the venv's
own folder, ``bin``, and everything under ``lib`` (site-packages included), walked
without following a link. The next check skips the hashing only when the memo

- is a regular file read bounded with no link followed from the cache down
  (:mod:`pinwheel.untrusted`), of this format, for this venv's path and lock digest,
  and names only relative paths inside the venv;
- is signed (HMAC-SHA256, :mod:`pinwheel.keyfile`) with the cache's own ``venv-memo``
  key, which only this user can read: whoever can write the cache but not read the key
  cannot make a memo pinwheel accepts;
- and equals the venv now, entry for entry: no file or folder added, removed or renamed
  and every ``lstat`` field the same. A rewrite changes size or mtime, ``utime`` can set
  mtime back but never ctime, a replacement changes the inode.

Anything else (no key, no memo, another key's or an edited one, a link planted for it)
is a miss: the full check runs and, when it passes, writes a new memo. A memo is not
written when any entry's ctime is within :data:`RACY_NS` of the check's start (a file
changed while it was hashed, or within the clock's tick of it): the next check hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import cachelayout, confine, keyfile, untrusted
from pinwheel.errors import PinwheelError

FORMAT = "pinwheel.venv-memo/1"
KEY_NAME = "venv-memo"  # <cache>/keys/venv-memo.key
_PURPOSE = "pinwheel venv memo"
FOLDER = f"{cachelayout.bucket(Path(), 'memo').name}/venv"  # <cache>/memo/venv/
RACY_NS = 2_000_000_000  # a default: entries changed this close to the check are not memoised
KIND = untrusted.Kind(
    "venv memo", 64 * untrusted.MiB, 8, PinwheelError,
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
    """Every entry of a venv as a check reads it: ``lstat`` fields and folder listings."""

    entries: dict[str, list[int]]  # relative path -> [size, mtime_ns, inode, mode, ctime_ns]
    dirs: dict[str, list[str]]  # relative folder ("." the venv) -> its names, sorted

    def newest_ctime(self) -> int:
        return max((e[4] for e in self.entries.values()), default=0)


def _fields(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_ctime_ns]


def snapshot(venv: Path, site: Path) -> Snapshot | None:
    """The venv's entries now: its own folder and ``bin`` (their entries), everything under
    ``lib`` (recursively); no link is followed. None when ``site`` (the site-packages the
    check reads) is not a folder reached without a link: such a venv is never memoised."""
    venv = Path(venv)
    entries: dict[str, list[int]] = {}
    dirs: dict[str, list[str]] = {}

    def listing(rel: str, deep: bool) -> None:
        path = venv / rel if rel != "." else venv
        try:
            with os.scandir(path) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError:
            return
        dirs[rel] = [e.name for e in found]
        for e in found:
            sub = e.name if rel == "." else f"{rel}/{e.name}"
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            entries[sub] = _fields(st)
            if deep and stat.S_ISDIR(st.st_mode):
                listing(sub, True)

    try:
        entries["."] = _fields(os.lstat(venv))
    except OSError:
        return None
    if not stat.S_ISDIR(entries["."][3]):
        return None
    listing(".", False)
    if stat.S_ISDIR(entries.get("bin", [0, 0, 0, 0])[3]):
        listing("bin", False)
    if stat.S_ISDIR(entries.get("lib", [0, 0, 0, 0])[3]):
        listing("lib", True)
    try:
        site_rel = Path(site).relative_to(venv).as_posix()
    except ValueError:
        return None
    if site_rel not in dirs:  # reached through a link, or not there: not memoised
        return None
    return Snapshot(entries, dirs)


def _rel(venv: Path, lock_sha256: str) -> str:
    where = json.dumps([os.fsdecode(os.path.abspath(venv)), lock_sha256])
    return f"{FOLDER}/{hashlib.sha256(where.encode()).hexdigest()}.json"


def _key(cache: Path) -> bytes | None:
    try:
        return keyfile.cache_key(cache, KEY_NAME)
    except keyfile.NoKey:
        return None


def _payload(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _inside(rel: object) -> bool:
    """A relative path inside the venv: no root, no empty, ``.`` or ``..`` part, no NUL."""
    if not isinstance(rel, str) or rel == ".":
        return rel == "."
    parts = rel.split("/")
    return "\0" not in rel and all(p not in ("", ".", "..") for p in parts)


def _valid(doc: Mapping[str, Any]) -> Snapshot | None:
    entries, dirs = doc.get("entries"), doc.get("dirs")
    if not isinstance(entries, dict) or not isinstance(dirs, dict):
        return None
    for rel, fields in entries.items():
        if not _inside(rel) or not isinstance(fields, list) or len(fields) != 5:
            return None
        if any(type(v) is not int or not 0 <= v < _MAX_INT for v in fields):
            return None
    for rel, names in dirs.items():
        if not _inside(rel) or not isinstance(names, list):
            return None
        if any(not isinstance(n, str) or not _inside(n) or "/" in n for n in names):
            return None
    return Snapshot(entries, dirs)


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
    found = _valid(doc)
    if found is None:
        return None, "the memo names a path outside the venv or a malformed entry"
    return found, ""


def unchanged(scope: Scope, venv: Path, site: Path) -> tuple[bool, str]:
    """Whether ``venv`` is, entry for entry, what its signed memo recorded: (True, "") or
    (False, why the files must be hashed)."""
    memo, why = load(scope, venv)
    if memo is None:
        return False, why
    now = snapshot(venv, site)
    if now is None:
        return False, "its site-packages is not a folder reached without a link"
    if now.dirs != memo.dirs:
        changed = sorted(set(now.dirs) ^ set(memo.dirs)) or sorted(
            d for d in now.dirs if now.dirs[d] != memo.dirs.get(d)
        )
        return False, f"a file or folder was added or removed ({changed[0]})"
    if now.entries != memo.entries:
        moved = sorted(r for r in now.entries if now.entries[r] != memo.entries.get(r))
        return False, f"{(moved or ['an entry'])[0]} changed since the last check"
    return True, ""


def save(scope: Scope, venv: Path, site: Path, begun_ns: int) -> bool:
    """Record ``venv`` as it is now, signed, after a check (begun at ``begun_ns``,
    ``time.time_ns()``) found its files to be their RECORDs. Not written (False) when there
    is no key, the venv cannot be walked without a link, or an entry changed within
    :data:`RACY_NS` of the check's start."""
    key = _key(scope.cache)
    now = snapshot(venv, site)
    if key is None or now is None or now.newest_ctime() >= begun_ns - RACY_NS:
        return False
    body = {
        "format": FORMAT,
        "venv": os.fsdecode(os.path.abspath(venv)),
        "lock_sha256": scope.lock_sha256,
        "entries": now.entries,
        "dirs": now.dirs,
    }
    doc = {**body, "signature": keyfile.sign(key, _PURPOSE, _payload(body))}
    try:  # every folder from the cache down opened O_NOFOLLOW; a link there is replaced
        confine.write_beneath(Path(scope.cache), _rel(venv, scope.lock_sha256),
                              json.dumps(doc, sort_keys=True).encode())  # fmt: skip
    except (confine.Escape, OSError):  # a memo only saves time
        return False
    return True


__all__ = ["FORMAT", "KEY_NAME", "RACY_NS", "Scope", "Snapshot", "load", "save", "snapshot",
           "unchanged"]  # fmt: skip
