"""A wheel's own description: METADATA and WHEEL, parsed by ``packaging``, held to the filename.

PEP 427 names a wheel ``{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl``;
the same facts live inside it, in ``{name}-{version}.dist-info/METADATA`` (Name,
Version, Metadata-Version: the core metadata spec) and ``.../WHEEL`` (one
``Tag:`` line per compatible tag). A retag or relabel that rewrites one and not
the other gives a wheel that installers treat differently (pip trusts the file
name for resolution, then the METADATA for the installed record).
:func:`read_meta` reads both with a byte cap through the bounded member reader,
parses METADATA with :class:`packaging.metadata.Metadata` (validating) and
returns every disagreement as a problem string, never an exception.

:func:`direct_references` names ``Requires-Dist`` entries that point at a URL
(``pkg @ file:///...``, ``pkg @ git+https://...``): an installer would fetch
those from wherever they point, outside any hash pin.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field

from packaging.metadata import ExceptionGroup as MetadataErrors
from packaging.metadata import Metadata
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, parse_tag
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)

from pinwheel.wheels.wheelfile import READ_ERRORS, stream_member

CAP = 4 * 1024 * 1024  # METADATA / WHEEL: real ones are kilobytes (a long description: ~100 KiB)


@dataclass(frozen=True)
class WheelMeta:
    """What METADATA and WHEEL say, and where they disagree with the file name."""

    filename: str
    name: str | None  # METADATA Name, as written
    version: str | None  # METADATA Version, as written
    metadata_version: str | None
    requires_python: str | None
    requires_dist: tuple[str, ...]
    tags: frozenset[str]  # WHEEL Tag lines, expanded
    metadata: bytes  # METADATA's bytes as stored (PEP 658 serves exactly these)
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems


def _member(zf: zipfile.ZipFile, name: str) -> tuple[bytes | None, str | None]:
    try:
        info = zf.getinfo(name)
    except KeyError:
        return None, f"{name} missing"
    buf = io.BytesIO()
    problem = stream_member(zf, info, buf.write, CAP)
    return (None, f"{name}: {problem}") if problem else (buf.getvalue(), None)


def _wheel_tags(text: str) -> frozenset[str]:
    tags: set[Tag] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "tag" and value.strip():
            tags |= parse_tag(value.strip())
    return frozenset(str(t) for t in tags)


def read_meta(zf: zipfile.ZipFile, filename: str) -> WheelMeta:
    """METADATA and WHEEL of the open wheel ``zf`` named ``filename``, checked against it."""
    problems: list[str] = []
    try:
        fname, fversion, _build, ftags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        return WheelMeta(filename, None, None, None, None, (), frozenset(), b"",
                         (f"not a wheel file name: {exc}",))  # fmt: skip
    # The .dist-info directory is named by the file name's first two fields (PEP 427).
    dist_infos = sorted(
        {
            n.split("/", 1)[0]
            for n in zf.namelist()
            if n.count("/") == 1 and n.split("/", 1)[0].endswith(".dist-info")
        }  # fmt: skip
    )
    if len(dist_infos) != 1:
        found = dist_infos or "none"
        problems.append(f"expected one top-level .dist-info directory, found {found}")
        return WheelMeta(filename, None, None, None, None, (), frozenset(), b"", tuple(problems))
    dist_info = dist_infos[0]
    stem = dist_info.removesuffix(".dist-info")
    d_name, _, d_version = stem.rpartition("-")
    if canonicalize_name(d_name) != fname or canonicalize_version(d_version) != \
            canonicalize_version(fversion):  # fmt: skip
        problems.append(f"{dist_info} does not match the file name's {fname} {fversion}")
    raw, problem = _member(zf, f"{dist_info}/METADATA")
    if problem:
        problems.append(problem)
    wheel_raw, problem = _member(zf, f"{dist_info}/WHEEL")
    if problem:
        problems.append(problem)
    name = version = mversion = requires_python = None
    requires: tuple[str, ...] = ()
    if raw is not None:
        try:
            meta = Metadata.from_email(raw, validate=True)
        except MetadataErrors as group:
            problems += [f"METADATA: {e}" for e in group.exceptions]
        except (ValueError, UnicodeDecodeError) as exc:
            problems.append(f"METADATA: {exc}")
        else:
            name, mversion = meta.name, meta.metadata_version
            version = str(meta.version)
            requires_python = str(meta.requires_python) if meta.requires_python else None
            requires = tuple(str(r) for r in meta.requires_dist or ())
            if canonicalize_name(name) != fname:
                problems.append(f"METADATA Name {name!r} is not the file name's {fname!r}")
            if meta.version != fversion:
                problems.append(
                    f"METADATA Version {version!r} is not the file name's {str(fversion)!r}"
                )
    tags: frozenset[str] = frozenset()
    if wheel_raw is not None:
        try:
            tags = _wheel_tags(wheel_raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            problems.append(f"WHEEL: not readable: {exc}")
        want = frozenset(str(t) for t in ftags)
        if tags != want:
            problems.append(
                f"WHEEL tags {sorted(tags) or 'none'} are not the file name's {sorted(want)}"
            )
    return WheelMeta(filename, name, version, mversion, requires_python, requires, tags,
                     raw or b"", tuple(problems))  # fmt: skip


def read_path(path: str | object) -> WheelMeta:
    """:func:`read_meta` for a wheel on disk (an unreadable archive is one problem)."""
    from pathlib import Path

    p = Path(str(path))
    try:
        with zipfile.ZipFile(p) as zf:
            return read_meta(zf, p.name)
    except READ_ERRORS as exc:
        return WheelMeta(p.name, None, None, None, None, (), frozenset(), b"",
                         (f"not a readable wheel: {exc}",))  # fmt: skip


def direct_references(requires_dist: tuple[str, ...]) -> list[str]:
    """The ``Requires-Dist`` entries that name a URL (PEP 508 ``name @ url``) or do not parse."""
    bad = []
    for text in requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            bad.append(text)
            continue
        if req.url:
            bad.append(text)
    return bad
