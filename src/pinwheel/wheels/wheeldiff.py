"""Which members of two wheels differ: bytes, presence, zip metadata, order; for an ELF
member, where: the first dynamic symbol name, else the first section, that differs.

One implementation for ``verify-build``, ``pinwheel kernels --twice`` and ``pinwheel
wheeldiff``. Both wheels are read as untrusted: zip limits first (wheelfile.Limits), then
members streamed in chunks; an ELF member is spooled to a temporary file and read with
``pread`` (elf.FileReader), never whole into memory.
"""

from __future__ import annotations

import hashlib
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pinwheel.wheels import elf
from pinwheel.wheels.wheelfile import CHUNK, READ_ERRORS, Limits, header_issues

BUILD_ID = ".note.gnu.build-id"
MAX_SYMBOLS = 4_000_000  # a .dynsym with more entries is read only this far


@dataclass(frozen=True)
class MemberDiff:
    member: str
    change: str  # "differs" | "only in recorded" | "only in rebuilt" | "differs (zip ...)"
    where: str | None = None  # ELF: "dynamic symbol 'A' vs 'B'" or "section .x"

    def line(self) -> str:
        return f"{self.change}: {self.member}" + (f" ({self.where})" if self.where else "")

    def to_json(self) -> dict[str, str]:
        out = {"member": self.member, "change": self.change}
        if self.where:
            out["where"] = self.where
        return out


class UnreadableWheel(ValueError):
    """A wheel that is not a zip, or whose members break the zip limits."""


def diff_members(a: Path, b: Path, limits: Limits | None = None) -> tuple[MemberDiff, ...]:
    """Zip members whose bytes or metadata (time, mode) differ between two wheels; for an
    ELF member whose bytes differ, the first differing dynamic symbol or section."""
    limits = limits or Limits()
    with _open(a, limits) as za, _open(b, limits) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        diffs = [MemberDiff(n, "only in recorded") for n in sorted(ia.keys() - ib.keys())]
        diffs += [MemberDiff(n, "only in rebuilt") for n in sorted(ib.keys() - ia.keys())]
        for name in sorted(ia.keys() & ib.keys()):
            x, y = ia[name], ib[name]
            if x.CRC != y.CRC or x.file_size != y.file_size or _digest(za, x) != _digest(zb, y):
                diffs.append(MemberDiff(name, "differs", _elf_where(za, x, zb, y)))
            elif (x.date_time, x.external_attr) != (y.date_time, y.external_attr):
                diffs.append(MemberDiff(name, "differs (zip metadata: time or mode)"))
        if not diffs and [i.filename for i in za.infolist()] != [i.filename for i in zb.infolist()]:
            diffs.append(MemberDiff("(member order)", "differs"))
    return tuple(diffs)


def _open(path: Path, limits: Limits) -> zipfile.ZipFile:
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UnreadableWheel(f"{path}: not a readable wheel ({exc})") from None
    issues, unreadable = header_issues(zf, limits)
    if unreadable:
        zf.close()
        first = next(i for i in issues if i.member in unreadable or i.member is None)
        raise UnreadableWheel(f"{path}: {first.member or 'archive'}: {first.message}")
    return zf


def _chunks(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    with zf.open(info) as f:
        while block := f.read(CHUNK):
            yield block


def _digest(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    h = hashlib.sha256()
    try:
        for block in _chunks(zf, info):
            h.update(block)
    except READ_ERRORS as exc:
        return f"unreadable: {exc}"
    return h.hexdigest()


def _spool(zf: zipfile.ZipFile, info: zipfile.ZipInfo, fh: BinaryIO) -> bool:
    head = b""
    try:
        for block in _chunks(zf, info):
            head = head or block[:4]
            fh.write(block)
    except READ_ERRORS:
        return False
    fh.flush()
    return head == elf.ELF_MAGIC


def _elf_where(
    za: zipfile.ZipFile, x: zipfile.ZipInfo, zb: zipfile.ZipFile, y: zipfile.ZipInfo
) -> str | None:
    """Where two ELF members first differ: a dynamic symbol name, else a section."""
    if x.filename.endswith("/"):
        return None
    with tempfile.TemporaryFile() as fa, tempfile.TemporaryFile() as fb:
        if not (_spool(za, x, fa) and _spool(zb, y, fb)):
            return None
        ra, rb = elf.FileReader(fa), elf.FileReader(fb)
        try:
            ea, eb = elf.parse(ra), elf.parse(rb)
            return first_difference(ea, ra, eb, rb)
        except elf.ElfError as exc:
            return f"ELF unreadable: {exc}"


def first_difference(ea: elf.ElfFile, ra: elf.Reader, eb: elf.ElfFile, rb: elf.Reader) -> str:
    """The first (by name) dynamic symbol in one and not the other, each side's, else the
    first section (in file order) whose name, size or bytes differ, else the headers."""
    sa, sb = dynamic_symbols(ea, ra), dynamic_symbols(eb, rb)
    only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
    if only_a or only_b:  # the linker orders .dynsym by hash: compare names, not places
        return f"dynamic symbol {_first(only_a)} vs {_first(only_b)}"
    for i, (na, nb) in enumerate(zip(sa, sb, strict=False)):
        if na != nb:
            return f"dynamic symbol #{i}: {na!r} vs {nb!r} (same names, another order)"
    names_a = [s.name for s in ea.sections]
    if names_a != [s.name for s in eb.sections]:
        return f"section list: {', '.join(names_a)} vs {', '.join(s.name for s in eb.sections)}"
    pairs = list(zip(ea.sections, eb.sections, strict=True))
    # the build id is a digest of the rest: named only when nothing else differs
    pairs.sort(key=lambda p: p[0].name == BUILD_ID)
    for x, y in pairs:
        if x.size != y.size:
            return f"section {x.name or '(unnamed)'}: {x.size} vs {y.size} bytes"
        if x.type != elf.SHT_NOBITS and not _same_bytes(ra, x, rb, y):
            return f"section {x.name or '(unnamed)'}"
    return "ELF headers or bytes outside sections"


def _first(names: list[str]) -> str:
    if not names:
        return "(none)"
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    return f"{names[0]!r}{more}"


def _same_bytes(ra: elf.Reader, x: elf.Section, rb: elf.Reader, y: elf.Section) -> bool:
    for at in range(0, x.size, CHUNK):
        n = min(CHUNK, x.size - at)
        if ra.read_at(x.offset + at, n) != rb.read_at(y.offset + at, n):
            return False
    return True


def dynamic_symbols(ef: elf.ElfFile, src: elf.Reader) -> list[str]:
    """The names in ``.dynsym`` (SHT_DYNSYM), in table order."""
    dyn = next((s for s in ef.sections if s.type == elf.SHT_DYNSYM), None)
    if dyn is None or dyn.link >= len(ef.sections):
        return []
    strs = ef.sections[dyn.link]
    if strs.type == elf.SHT_NOBITS:
        return []
    table = src.read_at(strs.offset, min(strs.size, elf.MAX_TABLE))
    step = 24 if ef.bits == 64 else 16
    data = src.read_at(dyn.offset, min(dyn.size, step * MAX_SYMBOLS))
    names = []
    for at in range(0, len(data) - step + 1, step):
        (off,) = struct.unpack_from(ef.endian + "I", data, at)
        end = table.find(b"\0", off)
        names.append(table[off : end if end >= 0 else len(table)].decode("utf-8", "replace"))
    return names


__all__ = ["MemberDiff", "UnreadableWheel", "diff_members", "dynamic_symbols", "first_difference"]
