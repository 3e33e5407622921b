"""The release's runtime lock: ``pylock.toml`` (PEP 751), every package pinned by hash.

The environment qualification ran in (torch and every dependency) is written
as a PEP 751 lock where qualification runs (``pip lock`` or ``uv pip compile
--format pylock.toml``) and shipped with the release (``pinwheel release
--lock PATH``; SHA256SUMS lists it). ``install`` then installs that lock with
pip or uv, which check every file against its hash, and the release's own
wheels after it from the verified directory.

:func:`check` reads a lock as untrusted input: bounded size, TOML, lock-version
1.x, and every package a plain ``name``/``version`` with wheels or an sdist
that carry a sha256 and an http(s) URL. A package from a VCS, a directory or a
local archive is refused: nothing outside a hash enters the environment.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import untrusted, validate
from pinwheel.errors import VerifyError

FILENAME = "pylock.toml"
LOCK = untrusted.Kind(
    FILENAME,
    16 * 1024 * 1024,
    0,
    VerifyError,
    "write the lock where qualification ran (`pip lock` / `uv pip compile --format pylock.toml`)",
)
_SHA = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class Lock:
    path: Path
    packages: tuple[tuple[str, str], ...]  # (name, version)
    files: int  # wheels + sdists, each with a sha256


def _file_problem(entry: Any, what: str) -> str | None:
    if not isinstance(entry, dict):
        return f"{what} is not a table"
    hashes = entry.get("hashes")
    sha = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        return f"{what} has no sha256 hash"
    url = entry.get("url")
    if not isinstance(url, str) or validate.http_url_problem(url):
        return f"{what} has no http(s) url ({str(url)[:80]!r})"
    return None


def check(path: Path) -> Lock:
    """The lock, if every package in it is hash-pinned from an http(s) URL; else raise."""
    data = untrusted.read_bytes(path, LOCK)
    try:
        doc = tomllib.loads(untrusted.text(data, LOCK, str(path)))
    except tomllib.TOMLDecodeError as exc:
        raise untrusted.fail(LOCK, f"not TOML: {exc}", str(path)) from None
    version = doc.get("lock-version")
    if not isinstance(version, str) or not version.startswith("1."):
        raise untrusted.fail(LOCK, f"lock-version {version!r} is not 1.x (PEP 751)", str(path))
    problems: list[str] = []
    packages: list[tuple[str, str]] = []
    files = 0
    for i, pkg in enumerate(doc.get("packages") or []):
        if not isinstance(pkg, dict):
            problems.append(f"packages[{i}] is not a table")
            continue
        name, ver = pkg.get("name"), pkg.get("version")
        label = f"packages[{i}] {str(name)[:60]!r}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(f"{label}: not a package name")
            continue
        if not isinstance(ver, str) or validate.version_problem(ver):
            problems.append(f"{label}: no pinned version")
            continue
        for source in ("vcs", "directory", "archive"):
            if source in pkg:
                problems.append(f"{label}: a {source} source is not hash-pinned from an index")
        entries = [("sdist", pkg["sdist"])] if "sdist" in pkg else []
        entries += [(f"wheels[{j}]", w) for j, w in enumerate(pkg.get("wheels") or [])]
        if not entries:
            problems.append(f"{label}: no wheels and no sdist")
        for what, entry in entries:
            problem = _file_problem(entry, f"{label} {what}")
            if problem:
                problems.append(problem)
            else:
                files += 1
        packages.append((name, ver))
    if problems:
        raise untrusted.fail(LOCK, "refused:\n    " + "\n    ".join(problems[:20]), str(path))
    if not packages:
        raise untrusted.fail(LOCK, "lists no packages", str(path))
    return Lock(path, tuple(packages), files)
