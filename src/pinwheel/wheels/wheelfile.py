"""Wheel archive integrity: safe member names and types, bounded reads, RECORD hashes.

Everything here is hostile-input safe: member sizes come from the central
directory and are judged before a byte is decompressed (zip bombs: per-member
size, total size, compression ratio); members are then streamed in chunks
(memory stays at one chunk whatever the member size), and a damaged member
(bad deflate data, encryption, an unknown compression method, a CRC mismatch)
becomes an :class:`Issue` naming it, never an exception.

:func:`audit` makes one pass: the header rules, RECORD (PEP 376/427) against
a streamed hash of every member, and optionally a spool of chosen members to
files (the ELF check reads those with ``pread``).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import lzma
import re
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from pinwheel import archive, validate
from pinwheel.progress import human_bytes

SAFE_HASHES = ("sha256", "sha384", "sha512")  # PEP 427: no md5/sha1
_DRIVE = re.compile(r"^[A-Za-z]:")
# zipfile can read these; anything else is refused by name rather than failing mid-read.
METHODS = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}
CHUNK = 1024 * 1024
MiB, GiB = 1024 * 1024, 1024 * 1024 * 1024

# What a damaged member raises from zipfile and its decompressors.
READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,  # bz2: "Invalid data stream"
    NotImplementedError,  # unsupported compression
    RuntimeError,  # encrypted
    ValueError,
    struct.error,
)


@dataclass(frozen=True)
class Limits:
    """Zip-bomb limits, judged from the central directory before anything is decompressed.

    Defaults are generous for real engine wheels (a 200 MB CUDA .so compresses 2-5x) and
    still refuse a 1 MB wheel that unpacks to 1 GiB.
    """

    member: int = 8 * GiB  # uncompressed bytes of one member
    total: int = 32 * GiB  # uncompressed bytes of all members
    ratio: float = 200.0  # uncompressed / compressed, for members larger than ratio_floor
    ratio_floor: int = 16 * MiB
    record: int = 64 * MiB  # RECORD itself


class Issue(NamedTuple):
    member: str | None
    message: str
    rule: str = "zip"  # "zip" (archive structure) | "record" (RECORD rows and hashes)


def header_issues(zf: zipfile.ZipFile, limits: Limits) -> tuple[list[Issue], set[str]]:
    """Rules judged from the central directory alone; and the members not safe to read."""
    issues: list[Issue] = []
    unreadable: set[str] = set()
    seen: set[str] = set()
    spelled: dict[str, str] = {}  # installed path -> the first member that spells it
    total = 0
    for info in zf.infolist():
        name = info.filename
        if name in seen:
            issues.append(Issue(name, "duplicate zip member (installers disagree on which wins)"))
            unreadable.add(name)
        else:
            path = installed_path(name)
            other = spelled.setdefault(path, name)
            if other != name:
                why = f"names the same file as {other!r} (installers disagree on which wins)"
                issues.append(Issue(name, why))
        seen.add(name)
        reason = validate.member_problem(name)
        if reason:
            issues.append(Issue(name, f"unsafe member name: {reason}"))
        kind = archive.zip_kind(info)
        if kind == "special":
            mode = info.external_attr >> 16
            issues.append(Issue(name, f"special file member (mode 0o{mode:o})"))
        if info.flag_bits & 0x1:
            issues.append(Issue(name, "encrypted member (wheels are never encrypted)"))
            unreadable.add(name)
        if info.compress_type not in METHODS:
            issues.append(
                Issue(
                    name,
                    f"unknown compression method {info.compress_type} "
                    f"(readable: {', '.join(METHODS.values())})",
                )
            )
            unreadable.add(name)
        size, packed = info.file_size, info.compress_size
        total += size
        if size > limits.member:
            issues.append(
                Issue(
                    name,
                    f"member unpacks to {human_bytes(size)}, over the {human_bytes(limits.member)} "
                    "per-member limit (zip bomb?)",
                )
            )
            unreadable.add(name)
        elif size > limits.ratio_floor and size > limits.ratio * max(packed, 1):
            issues.append(
                Issue(
                    name,
                    f"member unpacks {size / max(packed, 1):.0f}x ({human_bytes(packed)} -> "
                    f"{human_bytes(size)}), over the {limits.ratio:g}x ratio limit (zip bomb?)",
                )
            )
            unreadable.add(name)
    issues.extend(_file_and_folder(zf))
    if total > limits.total:
        issues.append(
            Issue(
                None,
                f"members unpack to {human_bytes(total)} in all, "
                f"over the {human_bytes(limits.total)} limit (zip bomb?)",
            )
        )
        unreadable.update(i.filename for i in zf.infolist())
    return issues, unreadable


def installed_path(name: str) -> str:
    """The path a member installs to: ``./x.py``, ``a//x.py`` and ``a/./x.py`` are one file."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    return "/".join(parts)


def _file_and_folder(zf: zipfile.ZipFile) -> list[Issue]:
    """Members that are a file and a folder at once (``a`` and ``a/b``; ``a`` and ``a/``):
    one of them cannot be installed."""
    files: dict[str, str] = {}
    folders: set[str] = set()
    for info in zf.infolist():
        path = installed_path(info.filename)
        if not path:
            continue
        if info.is_dir():
            folders.add(path)
        else:
            files.setdefault(path, info.filename)
        parts = path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return [
        Issue(files[path], "is a file and a folder at once (one of them cannot be installed)")
        for path in sorted(files.keys() & folders)
    ]


def stream_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, sink: Callable[[bytes], Any], limit: int
) -> str | None:
    """Feed the member to ``sink`` in chunks; the reason it is unreadable, or None.

    zipfile stops at the central directory's size and checks the CRC at the end, so
    a member that lies about its size is caught here too; ``limit`` is a second fence.
    """
    read = 0
    try:
        with zf.open(info) as fh:
            while block := fh.read(CHUNK):
                read += len(block)
                if read > limit:
                    return f"member is larger than {human_bytes(limit)} when unpacked (zip bomb?)"
                sink(block)
    except READ_ERRORS as exc:
        return f"damaged member, cannot be read: {_read_error(exc)}"
    return None


def _read_error(exc: BaseException) -> str:
    if isinstance(exc, zlib.error):
        return f"bad deflate data ({exc})"
    if isinstance(exc, zipfile.BadZipFile) and "CRC" in str(exc):
        return "CRC-32 mismatch (the data was altered or truncated)"
    if isinstance(exc, EOFError):
        return "compressed data ends early (truncated)"
    return f"{type(exc).__name__}: {exc}"


def record_name(zf: zipfile.ZipFile) -> str | None:
    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    return records[0] if len(records) == 1 else None


def record_rows(path: Path, limits: Limits | None = None) -> dict[str, tuple[str, str]]:
    """The wheel's RECORD rows (member -> (hash, size)), read under the archive limits;
    ``ValueError`` with the reason when the archive or its RECORD cannot be read."""
    limits = limits or Limits()
    try:
        with zipfile.ZipFile(path) as zf:
            issues, unreadable = header_issues(zf, limits)
            record = record_name(zf)
            rows, more = (None, [Issue(None, "expected exactly one <name>.dist-info/RECORD")]
                          ) if record is None else _read_record(zf, record, limits, unreadable)
    except READ_ERRORS as exc:
        raise ValueError(f"not a readable wheel: {_read_error(exc)}") from None
    if rows is None or issues or more:
        raise ValueError("; ".join(i.message for i in (*issues, *more))[:500])
    return rows


@dataclass
class Audit:
    """What one pass over a wheel found; ``spooled`` maps member -> file (caller cleans up)."""

    issues: list[Issue] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    spooled: dict[str, Path] = field(default_factory=dict)


def _read_record(
    zf: zipfile.ZipFile, record: str, limits: Limits, unreadable: set[str]
) -> tuple[dict[str, tuple[str, str]] | None, list[Issue]]:
    """RECORD's rows, or None (with the reason) when it cannot be read at all."""
    issues: list[Issue] = []
    if record in unreadable:
        return None, [
            Issue(record, "RECORD cannot be read (see above); nothing was verified", "record")
        ]
    buf = io.BytesIO()
    problem = stream_member(zf, zf.getinfo(record), buf.write, limits.record)
    if problem:
        return None, [Issue(record, problem, "record")]
    try:
        text = buf.getvalue().decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [
            Issue(record, f"RECORD is not UTF-8 (byte {exc.start}: {exc.reason})", "record")
        ]
    listed: dict[str, tuple[str, str]] = {}
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        return None, [Issue(record, f"RECORD is not valid CSV: {exc}", "record")]
    for row in rows:
        if not row:
            continue
        if len(row) != 3:
            issues.append(Issue(record, f"malformed RECORD row {row!r}"[:300], "record"))
            continue
        if row[0] in listed:
            issues.append(Issue(record, f"RECORD lists {row[0]!r} twice", "record"))
        listed[row[0]] = (row[1], row[2])
    return listed, issues


def audit(
    zf: zipfile.ZipFile,
    limits: Limits | None = None,
    *,
    spool: Callable[[zipfile.ZipInfo], bool] | None = None,
    spool_dir: Path | None = None,
) -> Audit:
    """Header rules, then every member streamed once: RECORD hash and size, CRC, spooling."""
    limits = limits or Limits()
    result = Audit(members=[i.filename for i in zf.infolist()])
    issues, unreadable = header_issues(zf, limits)
    result.issues.extend(issues)
    record = record_name(zf)
    listed: dict[str, tuple[str, str]] | None = None
    if record is None:
        found = [n for n in zf.namelist() if n.endswith("RECORD")]
        result.issues.append(
            Issue(
                None,
                f"expected exactly one <name>.dist-info/RECORD, found {found or 'none'}",
                "record",
            )
        )
    else:
        listed, problems = _read_record(zf, record, limits, unreadable)
        result.issues.extend(problems)
    signatures = {record, f"{record}.jws", f"{record}.p7s"} if record else set()
    members: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        if archive.zip_kind(info) != "dir":
            members.setdefault(info.filename, info)
    for name, info in members.items():
        kind = archive.zip_kind(info)
        if name in unreadable:
            continue
        if kind == "symlink":
            target = bytearray()
            stream_member(zf, info, target.extend, 4096)
            result.issues.append(
                Issue(
                    name,
                    f"symlink member (-> {bytes(target[:200]).decode('utf-8', 'replace')!r}); "
                    "wheels must hold plain files",
                )
            )
            continue
        if name in signatures:
            continue
        row = listed.get(name) if listed is not None else None
        algo, expected = "sha256", ""
        if listed is not None and row is None:
            result.issues.append(Issue(name, "not listed in RECORD", "record"))
        elif row is not None:
            algo, _, expected = row[0].partition("=")
            if algo not in SAFE_HASHES or not expected:
                result.issues.append(
                    Issue(name, f"RECORD hash {row[0]!r} is not sha256 or stronger", "record")
                )
                algo, expected = "sha256", ""
        spooling = spool is not None and spool(info)
        problem, actual, size, spooled = _stream_hashed(
            zf, info, algo, limits.member, spool_dir if spooling else None, spooling=spooling
        )
        if spooled is not None:
            result.spooled[name] = spooled
        if problem:
            result.issues.append(Issue(name, problem))
            continue
        if expected:
            result.issues += _record_mismatches(name, row, algo, expected, actual, size)
    for name in listed or {}:
        if name not in members and name not in signatures:
            result.issues.append(Issue(name, "listed in RECORD but not in the wheel", "record"))
    return result


def _stream_hashed(
    zf: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    algo: str,
    limit: int,
    spool_dir: Path | None,
    *,
    spooling: bool,
) -> tuple[str | None, str, int, Path | None]:
    """Stream one member once: (the problem reading it or None, its ``algo`` digest as
    RECORD writes it, its size, the file it was spooled to when ``spooling``: in
    ``spool_dir``, None: the default temporary folder). A member that fails is not kept."""
    digest = hashlib.new(algo)
    size = 0
    out = None
    if spooling:
        out = tempfile.NamedTemporaryFile(
            dir=spool_dir, prefix="member-", suffix=".bin", delete=False
        )
    sinks: list[Callable[[bytes], Any]] = [digest.update]
    if out is not None:
        sinks.append(out.write)

    def sink(block: bytes, sinks: list[Callable[[bytes], Any]] = sinks) -> None:
        nonlocal size
        size += len(block)
        for s in sinks:
            s(block)

    problem = stream_member(zf, info, sink, limit)
    spooled = None
    if out is not None:
        out.close()
        if problem:
            Path(out.name).unlink(missing_ok=True)
        else:
            spooled = Path(out.name)
    actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
    return problem, actual, size, spooled


def _record_mismatches(
    name: str, row: tuple[str, str] | None, algo: str, expected: str, actual: str, size: int
) -> list[Issue]:
    """A member's digest and size against its RECORD row."""
    issues = []
    if actual != expected:
        issues.append(
            Issue(
                name,
                f"RECORD {algo} mismatch: RECORD says {expected}, file is {actual}",
                "record",
            )
        )
    size_field = row[1] if row else ""
    if size_field and size_field != str(size):
        issues.append(
            Issue(
                name,
                f"RECORD size mismatch: RECORD says {size_field}, file is {size}",
                "record",
            )
        )
    return issues


def dist_name(wheel: str) -> str:
    """The distribution of a wheel file name, normalized as PEP 503 says (``packaging``).

    A name that is not a valid wheel file name still gets its first field normalized,
    so a checker can name it in a finding.
    """
    try:
        return canonicalize_name(parse_wheel_filename(wheel)[0])
    except InvalidWheelFilename:
        return canonicalize_name(wheel.split("-", 1)[0])
