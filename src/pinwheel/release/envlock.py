"""The runtime lock, written from the environment qualification ran in (``pinwheel runtime-lock``).

``pinwheel qualify --python VENV/bin/python`` runs the engine from a venv; this
module reads that venv's installed distributions and writes the ``pylock.toml``
(PEP 751) a release ships (``pinwheel release --lock``) and ``install`` installs
with hashes. Each distribution is pinned by the sha256 of the wheel that was
installed, only where that hash is *known*:

- **the release's own wheels** (``--release DIR``, checked against its
  SHA256SUMS): the installed RECORD must hold every file of the wheel's RECORD
  with the same hash, so the wheel of that sha256 is the one installed. They are
  listed under ``[tool.pinwheel] release-wheels`` (``install`` installs them from
  the verified release, after the lock), not as lock packages;
- **``direct_url.json``** (an install from a URL or file): pip records the
  archive's sha256 there; an http(s) URL with that hash becomes a lock entry. A
  local file's hash is known but no one else can fetch it: reported;
- **a lock the environment was installed from** (``--lock``, e.g. the release's
  ``pylock.toml``, ``pip lock``, ``uv pip compile --format pylock.toml``): its
  wheels for the same name, version and the installed WHEEL tags, cross-checked
  against ``direct_url.json`` when that holds a hash.

Anything else (an index install, which records no hash; a directory, editable or
VCS install; an ``.egg-info``) is **unpinned** and reported by name with why;
nothing is written while one is left, unless the user names it with
``--leave-out`` (then the lock's ``[tool.pinwheel] left-out`` says so). No hash is
ever made up.

The venv is a tree someone else filled: every file is read through
:func:`pinwheel.untrusted.read_beneath` (bounded, no link followed anywhere, a
FIFO or device refused without waiting), every name and version is matched whole
and bounded before it is compared or written.
"""

from __future__ import annotations

import base64
import csv
import io
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.pylock import Package, PackageWheel, Pylock
from packaging.specifiers import SpecifierSet
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)
from packaging.version import Version

from pinwheel import untrusted, validate
from pinwheel.errors import VerifyError
from pinwheel.fsutil import atomic_write_text
from pinwheel.release import pylock
from pinwheel.wheels.wheelfile import record_rows

_NEXT = (
    "point runtime-lock at the venv qualification ran in (`pinwheel qualify --python "
    "VENV/bin/python`), made by `pinwheel install`"
)
VENV_FILE = untrusted.Kind("installed distribution file", 4 * untrusted.MiB, 0, VerifyError, _NEXT)
RECORD = untrusted.Kind("installed RECORD", 64 * untrusted.MiB, 0, VerifyError, _NEXT)
DIRECT_URL = untrusted.Kind("direct_url.json", 64 * untrusted.KiB, 8, VerifyError, _NEXT)
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")
_PYDIR = re.compile(r"python3\.[0-9]{1,3}")
_TAG = re.compile(r"[A-Za-z0-9_.]{1,200}-[A-Za-z0-9_.]{1,200}-[A-Za-z0-9_.]{1,200}")
_DIST_INFO = re.compile(r"([A-Za-z0-9_.]{1,200})-([A-Za-z0-9_.!+]{1,128})\.dist-info")
MAX_DISTS = 5000


@dataclass(frozen=True)
class Installed:
    """One ``*.dist-info`` of the venv, read and checked."""

    folder: str
    name: str  # as METADATA spells it
    version: str
    tags: frozenset[str]  # WHEEL's Tag lines
    record: Mapping[str, str]  # path -> "sha256=..."
    direct_url: str | None
    direct_sha256: str | None  # what direct_url.json's archive_info says the archive hashed to
    source: str | None  # "archive", "directory", "vcs" (direct_url.json), None: not present
    installer: str | None


@dataclass(frozen=True)
class Pinned:
    name: str
    version: str
    wheels: tuple[pylock.LockedFile, ...]
    how: str  # "direct_url.json" | "lock" | "lock, matching direct_url.json"


@dataclass(frozen=True)
class ReleaseWheel:
    name: str
    version: str
    wheel: str
    sha256: str


@dataclass(frozen=True)
class Unpinned:
    name: str
    version: str
    why: str


@dataclass(frozen=True)
class EnvLock:
    venv: Path
    python: str | None  # "3.12.1" from pyvenv.cfg
    pinned: tuple[Pinned, ...]
    release: tuple[ReleaseWheel, ...]
    unpinned: tuple[Unpinned, ...]
    left_out: tuple[Unpinned, ...]


# --------------------------------------------------------------------------- reading the venv


def _fail(what: str, where: Path | str) -> VerifyError:
    return VerifyError(what, where=str(where), next=_NEXT)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _cfg(venv: Path) -> dict[str, str]:
    text = untrusted.text(untrusted.read_beneath(venv, "pyvenv.cfg", VENV_FILE, cap=64 * 1024),
                          VENV_FILE, str(venv / "pyvenv.cfg"))  # fmt: skip
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def site_packages(venv: Path) -> tuple[str, str | None]:
    """``lib/python3.X/site-packages`` of ``venv`` (relative) and its Python from pyvenv.cfg.

    Refuses a venv that sees its base interpreter's packages: a lock of its own
    site-packages would not be the environment that ran.
    """
    st = _lstat(venv)
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise _fail(f"{venv} is not a venv directory (a symlink is not followed)", venv)
    cfg = _cfg(venv)
    if cfg.get("include-system-site-packages", "false").lower() == "true":
        raise _fail(
            "the venv sees its base Python's packages (include-system-site-packages = true): "
            "its own site-packages are not the environment that ran",
            venv / "pyvenv.cfg",
        )  # fmt: skip
    version = cfg.get("version") or cfg.get("version_info")
    if version is not None and not re.fullmatch(r"3\.[0-9]{1,3}\.[0-9]{1,3}", version):
        version = None  # not a version we write anywhere
    lib = _lstat(venv / "lib")
    if lib is None or not stat.S_ISDIR(lib.st_mode):
        raise _fail("no lib/ folder (a symlink is not followed)", venv / "lib")
    with os.scandir(venv / "lib") as it:
        dirs = sorted(
            e.name for e in it if _PYDIR.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
        )
    if len(dirs) != 1:
        raise _fail(f"expected one lib/python3.X folder, found {dirs[:5]}", venv / "lib")
    rel = f"lib/{dirs[0]}/site-packages"
    sp = _lstat(venv / rel)
    if sp is None or not stat.S_ISDIR(sp.st_mode):
        raise _fail("no site-packages folder (a symlink is not followed)", venv / rel)
    return rel, version


def _b64_hash(text: str) -> bool:
    algo, _, digest = text.partition("=")
    if algo != "sha256" or not digest:
        return False
    try:
        return len(base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))) == 32
    except ValueError:
        return False


def _record(venv: Path, rel: str) -> dict[str, str]:
    text = untrusted.text(untrusted.read_beneath(venv, rel, RECORD), RECORD, str(venv / rel))
    rows: dict[str, str] = {}
    try:
        for row in csv.reader(io.StringIO(text)):
            if not row:
                continue
            if len(row) != 3 or not row[0] or any(ord(c) < 32 for c in row[0]):
                raise untrusted.fail(RECORD, f"malformed row {row!r:.200}", str(venv / rel))
            if row[1] and not _b64_hash(row[1]):
                raise untrusted.fail(RECORD, f"row {row[0]!r:.200}: not a sha256 hash",
                                     str(venv / rel))  # fmt: skip
            if row[2] and not re.fullmatch(r"[0-9]{1,15}", row[2]):
                raise untrusted.fail(RECORD, f"row {row[0]!r:.200}: size {row[2]!r:.40} is not a "
                                     "byte count", str(venv / rel))  # fmt: skip
            rows[row[0]] = row[1]
    except csv.Error as exc:
        raise untrusted.fail(RECORD, f"not CSV: {exc}", str(venv / rel)) from None
    return rows


def _direct_url(venv: Path, rel: str) -> tuple[str | None, str | None, str | None]:
    """(url, archive sha256, source kind) from direct_url.json (PEP 610)."""
    data = untrusted.read_beneath(venv, rel, DIRECT_URL)
    doc = untrusted.parse_json(data, DIRECT_URL, str(venv / rel))
    where = str(venv / rel)
    if not isinstance(doc, dict) or not isinstance(doc.get("url"), str):
        raise untrusted.fail(DIRECT_URL, "no url", where, field="url")
    url = doc["url"]
    if len(url) > 2000 or any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise untrusted.fail(DIRECT_URL, "not a plain URL", where, field="url")
    if "archive_info" not in doc:
        return url, None, "vcs" if "vcs_info" in doc else "directory"
    info = doc["archive_info"]
    if not isinstance(info, dict):
        raise untrusted.fail(DIRECT_URL, "not an object", where, field="archive_info")
    hashes = info.get("hashes")
    sha = hashes.get("sha256") if isinstance(hashes, dict) else None
    legacy = info.get("hash")
    if sha is None and isinstance(legacy, str) and legacy.startswith("sha256="):
        sha = legacy.removeprefix("sha256=")
    if sha is not None and not validate.is_sha256(sha):
        raise untrusted.fail(DIRECT_URL, "not a sha256", where, field="archive_info.hashes.sha256")
    if isinstance(legacy, str) and legacy.startswith("sha256=") and legacy != f"sha256={sha}":
        raise untrusted.fail(DIRECT_URL, "hash and hashes.sha256 disagree", where,
                             field="archive_info.hash")  # fmt: skip
    return url, sha, "archive"


def _metadata(venv: Path, rel: str) -> tuple[str, str]:
    from packaging.metadata import parse_email

    where = str(venv / rel)
    text = untrusted.text(untrusted.read_beneath(venv, rel, VENV_FILE), VENV_FILE, where)
    raw, _unparsed = parse_email(text)
    name, version = raw.get("name"), raw.get("version")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise untrusted.fail(VENV_FILE, f"{str(name)[:80]!r} is not a package name", where,
                             field="Name")  # fmt: skip
    if validate.version_problem(version):
        why = validate.version_problem(version)
        raise untrusted.fail(VENV_FILE, f"{str(version)[:80]!r}: {why}", where,
                             field="Version")  # fmt: skip
    assert isinstance(version, str)
    return name, version


def _tags(venv: Path, rel: str) -> frozenset[str]:
    where = str(venv / rel)
    text = untrusted.text(untrusted.read_beneath(venv, rel, VENV_FILE, cap=64 * 1024), VENV_FILE,
                          where)  # fmt: skip
    tags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Tag":
            value = value.strip()
            if not _TAG.fullmatch(value):
                raise untrusted.fail(VENV_FILE, f"Tag {value[:80]!r} is not a wheel tag", where)
            tags.add(value)
    return frozenset(tags)


def _optional(venv: Path, rel: str) -> bool:
    """Whether ``rel`` is there at all (a link counts: reading it is then the error)."""
    return _lstat(venv / rel) is not None


def read_one(venv: Path, sp: str, folder: str) -> Installed:
    base = f"{sp}/{folder}"
    name, version = _metadata(venv, f"{base}/METADATA")
    m = _DIST_INFO.fullmatch(folder)
    if m is None or canonicalize_name(m.group(1)) != canonicalize_name(name) or (
        canonicalize_version(m.group(2)) != canonicalize_version(version)
    ):
        raise _fail(f"the folder's name does not match METADATA ({name} {version})", venv / base)
    tags = _tags(venv, f"{base}/WHEEL") if _optional(venv, f"{base}/WHEEL") else frozenset()
    record = _record(venv, f"{base}/RECORD")
    url = sha = source = None
    if _optional(venv, f"{base}/direct_url.json"):
        url, sha, source = _direct_url(venv, f"{base}/direct_url.json")
    installer = None
    if _optional(venv, f"{base}/INSTALLER"):
        first = untrusted.read_beneath(venv, f"{base}/INSTALLER", VENV_FILE, cap=1024)
        word = first.decode("ascii", "replace").strip().splitlines()[:1]
        installer = word[0] if word and re.fullmatch(r"[A-Za-z0-9._-]{1,40}", word[0]) else None
    return Installed(folder, name, version, tags, record, url, sha, source, installer)


def installed(venv: Path) -> tuple[list[Installed], list[Unpinned], str | None]:
    """Every ``*.dist-info`` in the venv (sorted by folder), what cannot even be read as one
    (an ``.egg-info``, a link, a hostile file) and the venv's Python."""
    sp, python = site_packages(venv)
    found: list[Installed] = []
    bad: list[Unpinned] = []
    with os.scandir(venv / sp) as it:
        entries = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in it)
    for name, is_dir, is_link in entries:
        if len(found) + len(bad) >= MAX_DISTS:
            raise _fail(f"more than {MAX_DISTS} distributions", venv / sp)
        if name.endswith(".egg-info"):
            bad.append(Unpinned(name, "?", "an .egg-info: installed without a wheel, no hash"))
        if not name.endswith(".dist-info"):
            continue
        if is_link or not is_dir:
            bad.append(Unpinned(name, "?", "a .dist-info that is a link or not a folder: refused"))
            continue
        try:
            found.append(read_one(venv, sp, name))
        except VerifyError as exc:
            file = Path(exc.where).name if exc.where else name
            bad.append(Unpinned(name, "?", f"{file} unreadable: {exc.what}"))
    return found, bad, python


# --------------------------------------------------------------------------- pinning


def _wheel_name_ok(filename: str, dist: Installed) -> bool:
    try:
        name, version, _b, _t = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return name == canonicalize_name(dist.name) and canonicalize_version(
        version
    ) == canonicalize_version(dist.version)


def _record_matches(dist: Installed, wheel_rows: Mapping[str, tuple[str, str]]) -> str | None:
    """None when every file of the wheel's RECORD is installed with its hash; else the first
    that is not (installers move ``*.data/`` files and write their own dist-info files)."""
    for path, (digest, _size) in sorted(wheel_rows.items()):
        if not digest or ".data/" in path or path.endswith(".dist-info/RECORD"):
            continue
        if dist.record.get(path) != digest:
            return path
    return None


def _from_lock(dist: Installed, locks: Sequence[pylock.Lock]) -> Pinned | Unpinned | None:
    key = canonicalize_name(dist.name)
    for lock in locks:
        for name, version in lock.packages:
            if canonicalize_name(name) != key:
                continue
            if canonicalize_version(version) != canonicalize_version(dist.version):
                why = f"{lock.path.name} pins {version}, the venv has {dist.version}"
                return Unpinned(dist.name, dist.version, why)
            fits = [w for w in lock.wheels.get(name, ())
                    if _wheel_name_ok(w.name or _basename(w.url), dist)
                    and {str(t) for t in parse_wheel_filename(w.name or _basename(w.url))[3]}
                    & dist.tags]  # fmt: skip
            if dist.direct_sha256 is not None:
                fits = [w for w in fits if w.sha256 == dist.direct_sha256]
                if not fits:
                    return Unpinned(dist.name, dist.version,
                                    f"{lock.path.name} has no wheel of the sha256 direct_url.json "
                                    f"records ({dist.direct_sha256})")  # fmt: skip
                how = "lock, matching direct_url.json"
                return Pinned(dist.name, dist.version, tuple(fits), how)
            if not fits:
                tags = ", ".join(sorted(dist.tags)) or "none"
                why = f"{lock.path.name} has no wheel for the installed tags ({tags})"
                return Unpinned(dist.name, dist.version, why)
            return Pinned(dist.name, dist.version, tuple(fits), "lock")
    return None


def _basename(url: str) -> str:
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1])


def pin(
    dist: Installed, release: Mapping[str, tuple[str, str, Mapping[str, tuple[str, str]]]],
    locks: Sequence[pylock.Lock],
) -> Pinned | ReleaseWheel | Unpinned:  # fmt: skip
    """How ``dist``'s wheel is known by hash, or why it is not."""
    key = canonicalize_name(dist.name)
    if key in release:
        wheel, sha, rows = release[key]
        if not _wheel_name_ok(wheel, dist):
            return Unpinned(dist.name, dist.version, f"the release's wheel is {wheel}")
        differs = _record_matches(dist, rows)
        if differs is not None:
            return Unpinned(dist.name, dist.version, f"not installed from the release's {wheel}: "
                            f"{differs[:120]} differs from its RECORD")  # fmt: skip
        return ReleaseWheel(dist.name, dist.version, wheel, sha)
    if dist.source in ("directory", "vcs"):
        return Unpinned(dist.name, dist.version, f"installed from a {dist.source} "
                        f"({(dist.direct_url or '')[:120]}): no wheel hash")  # fmt: skip
    from_lock = _from_lock(dist, locks)
    if from_lock is not None:
        return from_lock
    if dist.direct_sha256 is not None and dist.direct_url is not None:
        url, filename = dist.direct_url, _basename(dist.direct_url)
        if not _wheel_name_ok(filename, dist):
            why = f"installed from {url[:120]}, not a wheel of this name and version"
            return Unpinned(dist.name, dist.version, why)
        if validate.http_url_problem(url):
            return Unpinned(dist.name, dist.version,
                            f"installed from {url[:120]} (sha256 {dist.direct_sha256}): a local "
                            "file no one else can fetch")  # fmt: skip
        wheel_file = pylock.LockedFile(filename, url, dist.direct_sha256)
        return Pinned(dist.name, dist.version, (wheel_file,), "direct_url.json")
    how = f"installed by {dist.installer}" if dist.installer else "installed"
    return Unpinned(dist.name, dist.version, f"{how} with no recorded hash (an index install "
                    "records none) and no --lock names it")  # fmt: skip


def _release_map(
    release_dir: Path | None,
) -> dict[str, tuple[str, str, Mapping[str, tuple[str, str]]]]:
    if release_dir is None:
        return {}
    from pinwheel.release.assemble import verify_release

    verified = verify_release(release_dir, allowed_signers=None, principal=None, require_all=False)
    out: dict[str, tuple[str, str, Mapping[str, tuple[str, str]]]] = {}
    for wheel, sha in sorted(verified.sums.items()):
        if not wheel.endswith(".whl") or not (release_dir / wheel).is_file():
            continue
        try:
            name = canonicalize_name(parse_wheel_filename(wheel)[0])
            rows = record_rows(release_dir / wheel)
        except (InvalidWheelFilename, ValueError) as exc:
            raise VerifyError(f"{wheel}: {exc}", where=str(release_dir / wheel),
                              next="run `pinwheel check` on the release") from None  # fmt: skip
        out[name] = (wheel, sha, rows)
    return out


RESOLVED = "pylock.pinwheel-resolved.toml"  # in a venv: the lock `pinwheel install` resolved


def resolved_lock(venv: Path) -> Path | None:
    """The lock ``pinwheel install`` resolved ``venv`` from (:data:`RESOLVED`), when it is a
    regular file there (never a link); :func:`pinwheel.release.pylock.check` reads it."""
    path = venv / RESOLVED
    return path if path.is_file() and not path.is_symlink() else None


def build(
    venv: Path,
    *,
    release_dir: Path | None = None,
    locks: Sequence[Path] = (),
    leave_out: Sequence[str] = (),
) -> EnvLock:
    """Read ``venv`` and pin what can be pinned (nothing is written; see :func:`write`).
    The lock ``pinwheel install`` resolved the venv from (``VENV/pylock.pinwheel-resolved
    .toml``) is one of ``locks`` when present."""
    resolved = resolved_lock(venv)
    if resolved is not None:
        locks = [*locks, resolved]
    checked = [pylock.check(p) for p in locks]
    release = _release_map(release_dir)
    dists, bad, python = installed(venv)
    wanted_out = {canonicalize_name(n) for n in leave_out}
    pinned: list[Pinned] = []
    ours: list[ReleaseWheel] = []
    unpinned: list[Unpinned] = list(bad)
    left: list[Unpinned] = []
    seen: dict[str, str] = {}
    for dist in dists:
        key = canonicalize_name(dist.name)
        if key in seen:
            unpinned.append(Unpinned(dist.name, dist.version, f"installed twice ({seen[key]})"))
            continue
        seen[key] = dist.folder
        got = pin(dist, release, checked)
        if isinstance(got, Unpinned) and key in wanted_out:
            left.append(got)
        elif isinstance(got, Unpinned):
            unpinned.append(got)
        elif isinstance(got, ReleaseWheel):
            ours.append(got)
        else:
            pinned.append(got)
    missing = wanted_out - {canonicalize_name(u.name) for u in left}
    if missing:
        raise VerifyError(
            "--leave-out names what is not an unpinned package of the venv: "
            + ", ".join(sorted(missing)),
            where=str(venv), next="name only packages runtime-lock reports as unpinned",
        )  # fmt: skip
    return EnvLock(venv, python, tuple(pinned), tuple(ours), tuple(unpinned), tuple(left))


# --------------------------------------------------------------------------- writing


def _q(value: str) -> str:
    """A value already checked to be plain printable ASCII (else ValueError)."""
    if any(not (32 <= ord(c) < 127) for c in value):
        raise ValueError(f"not plain ASCII: {value[:80]!r}")
    return value


def lock_of(env: EnvLock) -> Pylock:
    """The venv as a PEP 751 lock (``packaging.pylock``): each pinned package by its wheels'
    URL and sha256; the release's own wheels, the hash sources and what was left out in
    ``[tool.pinwheel]``."""
    pinned = sorted(env.pinned, key=lambda p: canonicalize_name(p.name))
    packages = [
        Package(name=canonicalize_name(_q(p.name)), version=Version(_q(p.version)), wheels=[
            PackageWheel(name=_q(w.name or _basename(w.url)), url=_q(w.url),
                         hashes={"sha256": _q(w.sha256)}) for w in p.wheels])
        for p in pinned
    ]  # fmt: skip
    tool: dict[str, Any] = {
        "source": "the environment qualification ran in (pinwheel runtime-lock)"}
    if env.python:
        tool["python"] = _q(env.python)
    tool["hash-from"] = {canonicalize_name(p.name): _q(p.how) for p in pinned}
    if env.release:
        tool["release-wheels"] = [
            {"name": canonicalize_name(r.name), "version": _q(r.version), "wheel": _q(r.wheel),
             "sha256": _q(r.sha256)} for r in env.release]  # fmt: skip
    if env.left_out:
        tool["left-out"] = [{"name": canonicalize_name(u.name), "version": _q(u.version),
                             "why": _q(u.why)} for u in env.left_out]  # fmt: skip
    python = ".".join(env.python.split(".")[:2]) if env.python else None
    return Pylock(
        lock_version=Version("1.0"), created_by="pinwheel runtime-lock", packages=packages,
        requires_python=SpecifierSet(f"=={python}.*") if python else None,
        tool={"pinwheel": tool},
    )  # fmt: skip


def render(env: EnvLock) -> str:
    return pylock.render(lock_of(env))


def unpinned_error(env: EnvLock, out: Path) -> VerifyError:
    shown = [f"{u.name} {u.version}: {u.why}" for u in env.unpinned[:30]]
    more = f"\n    ... and {len(env.unpinned) - 30} more" if len(env.unpinned) > 30 else ""
    return VerifyError(
        f"{len(env.unpinned)} installed distribution(s) have no known wheel hash; "
        f"{out} was not written:\n    " + "\n    ".join(shown) + more,
        where=str(env.venv),
        next="pass --lock FILE, a lock that pins them (`pip lock` / `uv pip compile --format "
        "pylock.toml` where qualification ran), or --leave-out NAME for a package the engine "
        "does not use (pip, setuptools); never a hash from elsewhere",
    )


def write(env: EnvLock, out: Path) -> pylock.Lock:
    """Write ``out`` atomically, refused while a distribution is unpinned; the text is checked
    by the lock reader ``release --lock`` and ``install`` use before it is placed."""
    if env.unpinned:
        raise unpinned_error(env, out)
    text = render(env)
    checked = pylock.check_text(text, out)
    atomic_write_text(out, text)
    return checked
