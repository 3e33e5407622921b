"""The release's runtime lock: ``pylock.toml`` (PEP 751), every package pinned by hash.

The environment qualification ran in (torch and every dependency) is written
as a PEP 751 lock where qualification runs (``pip lock`` or ``uv pip compile
--format pylock.toml``) and shipped with the release (``pinwheel release
--lock PATH``; SHA256SUMS lists it). ``install`` then installs that lock with
pip or uv, which check every file against its hash, and the release's own
wheels after it from the verified directory.

:func:`check` reads a lock as untrusted input: bounded size, TOML, then PEP 751
as pip and uv read it (``packaging.pylock``: lock-version 1.x, every field typed),
and pinwheel's rule on top: every package a plain ``name``/``version`` with wheels or an sdist
that carry a sha256 and an http(s) URL. A package from a VCS, a directory or a
local archive is refused: nothing outside a hash enters the environment.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from packaging.pylock import (
    PackageSdist,
    PackageWheel,
    Pylock,
    PylockUnsupportedVersionError,
    PylockValidationError,
)

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


def _file_problem(entry: PackageWheel | PackageSdist, what: str) -> str | None:
    sha = entry.hashes.get("sha256")
    if not validate.is_sha256(sha):
        return f"{what} has no sha256 hash"
    if entry.url is None or validate.http_url_problem(entry.url):
        return f"{what} has no http(s) url ({str(entry.url)[:80]!r})"
    return None


def check(path: Path) -> Lock:
    """The lock, if every package in it is hash-pinned from an http(s) URL; else raise."""
    data = untrusted.read_bytes(path, LOCK)
    return check_text(untrusted.text(data, LOCK, str(path)), path)


_WHEEL_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl")


def _release_wheels(tool: Mapping[str, Any] | None, path: Path) -> tuple[tuple[str, str], ...]:
    ours = tool.get("pinwheel") if tool is not None else None
    rows = ours.get("release-wheels") if isinstance(ours, dict) else None
    if rows is None:
        return ()
    if not isinstance(rows, list):
        raise untrusted.fail(LOCK, "tool.pinwheel.release-wheels is not a list", str(path))
    out = []
    for i, row in enumerate(rows):
        wheel = row.get("wheel") if isinstance(row, dict) else None
        sha = row.get("sha256") if isinstance(row, dict) else None
        if not (isinstance(wheel, str) and _WHEEL_FILE.fullmatch(wheel)
                and validate.is_sha256(sha)):  # fmt: skip
            raise untrusted.fail(
                LOCK, f"tool.pinwheel.release-wheels[{i}] is not a wheel file name and a sha256",
                str(path),
            )
        out.append((wheel, sha))
    return tuple(out)


def parse(text: str, path: Path) -> Pylock:
    """PEP 751 as pip and uv read it (``packaging.pylock``): TOML, lock-version 1.x, every
    field of its type; a refusal names the field."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise untrusted.fail(LOCK, f"not TOML: {exc}", str(path)) from None
    try:
        return Pylock.from_dict(doc)
    except PylockUnsupportedVersionError as exc:
        raise untrusted.fail(LOCK, f"lock-version is not 1.x (PEP 751): {str(exc)[:300]}",
                             str(path)) from None  # fmt: skip
    except PylockValidationError as exc:
        text = str(exc)
        shown = text if len(text) <= 400 else f"{text[:200]} ... {text[-200:]}"
        raise untrusted.fail(LOCK, f"not a PEP 751 lock: {shown}", str(path)) from None


def render(lock: Pylock) -> str:
    """The lock as TOML (``packaging.pylock``'s own mapping, written by tomlkit)."""
    return tomlkit.dumps(lock.to_dict())


def check_text(text: str, path: Path) -> Lock:
    """:func:`check` of a lock's text (``path`` names it in errors and in the result)."""
    lock = parse(text, path)
    problems: list[str] = []
    packages: list[tuple[str, str]] = []
    wheels: dict[str, tuple[LockedFile, ...]] = {}
    files = 0
    for i, pkg in enumerate(lock.packages):
        label = f"packages[{i}] {str(pkg.name)[:60]!r}"
        if pkg.version is None:
            problems.append(f"{label}: no pinned version")
            continue
        for source in ("vcs", "directory", "archive"):
            if getattr(pkg, source) is not None:
                problems.append(f"{label}: a {source} source is not hash-pinned from an index")
        entries: list[tuple[str, PackageWheel | PackageSdist]] = (
            [("sdist", pkg.sdist)] if pkg.sdist is not None else [])  # fmt: skip
        entries += [(f"wheels[{j}]", w) for j, w in enumerate(pkg.wheels or ())]
        if not entries:
            problems.append(f"{label}: no wheels and no sdist")
        kept: list[LockedFile] = []
        for what, entry in entries:
            problem = _file_problem(entry, f"{label} {what}")
            if problem:
                problems.append(problem)
                continue
            files += 1
            if isinstance(entry, PackageWheel):
                if entry.name is not None and not _WHEEL_FILE.fullmatch(entry.name):
                    problems.append(f"{label} {what}: name is not a wheel file name")
                    continue
                assert entry.url is not None
                kept.append(LockedFile(entry.name, entry.url, entry.hashes["sha256"]))
        packages.append((str(pkg.name), str(pkg.version)))
        wheels[str(pkg.name)] = (*wheels.get(str(pkg.name), ()), *kept)
    if problems:
        raise untrusted.fail(LOCK, "refused:\n    " + "\n    ".join(problems[:20]), str(path))
    if not packages:
        raise untrusted.fail(LOCK, "lists no packages", str(path))
    return Lock(path, tuple(packages), files, wheels, _release_wheels(lock.tool, path))
