"""Wheel archive integrity: safe member names and types, and RECORD (PEP 376/427) hashes.

Each function returns the problems it found as ``Issue(member, message)``;
the artifact check (:mod:`pinwheel.check`) turns them into findings.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import stat
import zipfile
from pathlib import PurePosixPath
from typing import NamedTuple

SAFE_HASHES = ("sha256", "sha384", "sha512")  # PEP 427: no md5/sha1
_DRIVE = re.compile(r"^[A-Za-z]:")


class Issue(NamedTuple):
    member: str | None
    message: str


def unsafe_name_reason(name: str) -> str | None:
    """Why extracting ``name`` could write outside the target directory, else None."""
    norm = name.replace("\\", "/")
    if norm.startswith("/") or _DRIVE.match(norm):
        return "absolute path"
    if ".." in PurePosixPath(norm).parts:
        return "'..' component escapes the install directory"
    if "\0" in name:
        return "NUL byte in name"
    return None


def member_type(info: zipfile.ZipInfo) -> str:
    """'file', 'dir', 'symlink' or 'special' from the Unix mode in external_attr."""
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        return "symlink"
    if kind == stat.S_IFDIR or info.filename.endswith("/"):
        return "dir"
    if kind in (0, stat.S_IFREG):  # 0: written without Unix attributes
        return "file"
    return "special"


def zip_issues(zf: zipfile.ZipFile) -> list[Issue]:
    issues: list[Issue] = []
    seen: set[str] = set()
    for info in zf.infolist():
        name = info.filename
        if name in seen:
            issues.append(Issue(name, "duplicate zip member (installers disagree on which wins)"))
        seen.add(name)
        reason = unsafe_name_reason(name)
        if reason:
            issues.append(Issue(name, f"unsafe member name: {reason}"))
        kind = member_type(info)
        if kind == "symlink":
            target = zf.read(info)[:200].decode("utf-8", "replace")
            issues.append(
                Issue(name, f"symlink member (-> {target!r}); wheels must hold plain files")
            )
        elif kind == "special":
            mode = info.external_attr >> 16
            issues.append(Issue(name, f"special file member (mode 0o{mode:o})"))
    return issues


def record_name(zf: zipfile.ZipFile) -> str | None:
    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    return records[0] if len(records) == 1 else None


def _digest(algo: str, data: bytes) -> str:
    raw = hashlib.new(algo, data).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def record_issues(zf: zipfile.ZipFile) -> list[Issue]:
    """Every file listed with a matching hash and size; nothing listed that is absent."""
    record = record_name(zf)
    if record is None:
        found = [n for n in zf.namelist() if n.endswith("RECORD")]
        return [
            Issue(None, f"expected exactly one <name>.dist-info/RECORD, found {found or 'none'}")
        ]
    issues: list[Issue] = []
    listed: dict[str, tuple[str, str]] = {}
    text = zf.read(record).decode("utf-8")
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if len(row) != 3:
            issues.append(Issue(record, f"malformed RECORD row {row!r}"))
            continue
        listed[row[0]] = (row[1], row[2])
    signatures = (record, record + ".jws", record + ".p7s")
    members = {i.filename: i for i in zf.infolist() if member_type(i) != "dir"}
    for name, info in members.items():
        if name in signatures:
            continue
        if name not in listed:
            issues.append(Issue(name, "not listed in RECORD"))
            continue
        hash_field, size_field = listed[name]
        algo, _, expected = hash_field.partition("=")
        if algo not in SAFE_HASHES or not expected:
            issues.append(Issue(name, f"RECORD hash {hash_field!r} is not sha256 or stronger"))
            continue
        data = zf.read(info)
        actual = _digest(algo, data)
        if actual != expected:
            issues.append(
                Issue(name, f"RECORD {algo} mismatch: RECORD says {expected}, file is {actual}")
            )
        if size_field and size_field != str(len(data)):
            issues.append(
                Issue(name, f"RECORD size mismatch: RECORD says {size_field}, file is {len(data)}")
            )
    for name in listed:
        if name not in members and name not in signatures:
            issues.append(Issue(name, "listed in RECORD but not in the wheel"))
    return issues
