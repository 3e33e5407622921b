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
from dataclasses import dataclass, field
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
class LockedFile:
    name: str | None  # the file name PEP 751 lets a lock give (a wheel's: its tags)
    url: str
    sha256: str


@dataclass(frozen=True)
class Lock:
    path: Path
    packages: tuple[tuple[str, str], ...]  # (name, version)
    files: int  # wheels + sdists, each with a sha256
    # name -> the package's wheels (an sdist is not a wheel: an installer builds it)
    wheels: dict[str, tuple[LockedFile, ...]] = field(default_factory=dict)
    # [tool.pinwheel] release-wheels: (file name, sha256) of the release's own wheels that were
    # installed where the lock was made (pinwheel runtime-lock); installed from the release
    release_wheels: tuple[tuple[str, str], ...] = ()


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
    return check_text(untrusted.text(data, LOCK, str(path)), path)


_WHEEL_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl")


def _release_wheels(doc: dict[str, Any], path: Path) -> tuple[tuple[str, str], ...]:
    tool = doc.get("tool")
    ours = tool.get("pinwheel") if isinstance(tool, dict) else None
    rows = ours.get("release-wheels") if isinstance(ours, dict) else None
    if rows is None:
        return ()
    if not isinstance(rows, list):
        raise untrusted.fail(LOCK, "tool.pinwheel.release-wheels is not a list", str(path))
    out = []
    for i, row in enumerate(rows):
        wheel = row.get("wheel") if isinstance(row, dict) else None
        sha = row.get("sha256") if isinstance(row, dict) else None
        if not (isinstance(wheel, str) and _WHEEL_FILE.fullmatch(wheel) and isinstance(sha, str)
                and _SHA.fullmatch(sha)):  # fmt: skip
            raise untrusted.fail(
                LOCK, f"tool.pinwheel.release-wheels[{i}] is not a wheel file name and a sha256",
                str(path),
            )
        out.append((wheel, sha))
    return tuple(out)


def check_text(text: str, path: Path) -> Lock:
    """:func:`check` of a lock's text (``path`` names it in errors and in the result)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise untrusted.fail(LOCK, f"not TOML: {exc}", str(path)) from None
    version = doc.get("lock-version")
    if not isinstance(version, str) or not version.startswith("1."):
        raise untrusted.fail(LOCK, f"lock-version {version!r} is not 1.x (PEP 751)", str(path))
    problems: list[str] = []
    packages: list[tuple[str, str]] = []
    wheels: dict[str, tuple[LockedFile, ...]] = {}
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
        raw_wheels = pkg.get("wheels") or []
        if not isinstance(raw_wheels, list):
            problems.append(f"{label}: wheels is not a list")
            continue
        entries += [(f"wheels[{j}]", w) for j, w in enumerate(raw_wheels)]
        if not entries:
            problems.append(f"{label}: no wheels and no sdist")
        kept: list[LockedFile] = []
        for what, entry in entries:
            problem = _file_problem(entry, f"{label} {what}")
            if problem:
                problems.append(problem)
                continue
            files += 1
            if what != "sdist":
                given = entry.get("name")
                if given is not None and not (isinstance(given, str)
                                              and _WHEEL_FILE.fullmatch(given)):  # fmt: skip
                    problems.append(f"{label} {what}: name is not a wheel file name")
                    continue
                kept.append(LockedFile(given, entry["url"], entry["hashes"]["sha256"]))
        packages.append((name, ver))
        wheels[name] = (*wheels.get(name, ()), *kept)
    if problems:
        raise untrusted.fail(LOCK, "refused:\n    " + "\n    ".join(problems[:20]), str(path))
    if not packages:
        raise untrusted.fail(LOCK, "lists no packages", str(path))
    return Lock(path, tuple(packages), files, wheels, _release_wheels(doc, path))
