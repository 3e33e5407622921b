"""A minimal ELF reader: section headers, one section's bytes, and the dynamic section.

Pure Python so the artifact check runs on a machine with no binutils and no
NVIDIA tools. It reads only what the check needs (``.nv_fatbin``,
DT_NEEDED/DT_RPATH/DT_RUNPATH, and the versioned symbol requirements) and
rejects anything malformed with :class:`ElfError` rather than guessing.

It reads through a :class:`Reader` (bytes in memory, or a file read with
``pread``), so a 200 MB shared object is never loaded whole: the check reads
the headers, the section name table and the dynamic section, each capped.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Protocol

ELF_MAGIC = b"\x7fELF"
SHT_NOBITS = 8
SHT_DYNAMIC = 6
SHT_DYNSYM = 11
SHT_GNU_VERNEED = 0x6FFFFFFE  # .gnu.version_r: the versions this object needs, per library
SHT_GNU_VERSYM = 0x6FFFFFFF  # .gnu.version: one version index per .dynsym entry
SHN_UNDEF = 0
MAX_VERNEED = 1 << 16  # verneed/vernaux entries followed before the chain is called malformed
DT_NULL, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 14, 15, 29
SHN_XINDEX = 0xFFFF
MAX_SECTIONS = 1 << 20  # real files have tens of thousands at most
MAX_TABLE = 64 * 1024 * 1024  # a section name or dynamic string table larger than this is refused


class ElfError(ValueError):
    """The bytes are not a well-formed ELF file (the caller adds which file)."""


class Reader(Protocol):
    """Random access to a file's bytes without holding them: ``size`` and ``read_at``."""

    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, n: int) -> bytes: ...


class BytesReader:
    def __init__(self, blob: bytes | bytearray | memoryview):
        self._view = memoryview(blob)

    @property
    def size(self) -> int:
        return len(self._view)

    def read_at(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:
            raise ElfError(f"negative offset {offset} or size {n}")
        return bytes(self._view[offset : offset + n])


class FileReader:
    """``pread`` on an open file: memory use is what the caller asks for, not the file size."""

    def __init__(self, fh: BinaryIO):
        self._fd = fh.fileno()
        self._size = os.fstat(self._fd).st_size

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:
            raise ElfError(f"negative offset {offset} or size {n}")
        n = max(0, min(n, self._size - offset))
        out = bytearray()
        while len(out) < n:
            block = os.pread(self._fd, n - len(out), offset + len(out))
            if not block:
                break
            out += block
        return bytes(out)


def as_reader(blob: bytes | bytearray | memoryview | Reader) -> Reader:
    if isinstance(blob, (bytes, bytearray, memoryview)):
        return BytesReader(blob)
    return blob


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int

    def data(self, blob: bytes | bytearray | memoryview | Reader) -> memoryview:
        """The section's bytes (for small sections; read large ones through a Reader)."""
        if self.type == SHT_NOBITS:
            return memoryview(b"")
        if isinstance(blob, (bytes, bytearray, memoryview)):
            return memoryview(blob)[self.offset : self.offset + self.size]
        return memoryview(blob.read_at(self.offset, self.size))


@dataclass(frozen=True)
class Dynamic:
    needed: tuple[str, ...]
    rpath: tuple[str, ...]  # DT_RPATH split on ':'
    runpath: tuple[str, ...]  # DT_RUNPATH split on ':'
    soname: str | None


@dataclass(frozen=True)
class ElfFile:
    bits: int  # 32 or 64
    endian: str  # "<" or ">"
    machine: int
    sections: tuple[Section, ...]

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)


def _unpack(fmt: str, buf: bytes, at: int, what: str) -> tuple[int, ...]:
    try:
        return struct.unpack_from(fmt, buf, at)
    except struct.error:
        raise ElfError(f"truncated {what}") from None


def parse(blob: bytes | bytearray | memoryview | Reader) -> ElfFile:
    src = as_reader(blob)
    head = src.read_at(0, 64)
    if len(head) < 52 or head[:4] != ELF_MAGIC:
        raise ElfError("not an ELF file (bad magic or shorter than an ELF header)")
    klass, data = head[4], head[5]
    if klass not in (1, 2) or data not in (1, 2):
        raise ElfError(f"unknown ELF class/encoding {klass}/{data}")
    bits = 64 if klass == 2 else 32
    e = "<" if data == 1 else ">"
    if bits == 64:
        if len(head) < 64:
            raise ElfError("truncated ELF header")
        (machine,) = _unpack(e + "H", head, 18, "ELF header")
        (shoff,) = _unpack(e + "Q", head, 40, "ELF header")
        shentsize, shnum, shstrndx = _unpack(e + "HHH", head, 58, "ELF header")
        shfmt = e + "IIQQQQIIQQ"
    else:
        (machine,) = _unpack(e + "H", head, 18, "ELF header")
        (shoff,) = _unpack(e + "I", head, 32, "ELF header")
        shentsize, shnum, shstrndx = _unpack(e + "HHH", head, 46, "ELF header")
        shfmt = e + "IIIIIIIIII"
    if shoff == 0:
        return ElfFile(bits, e, machine, ())  # no section headers (sstrip'ed)
    if shentsize < struct.calcsize(shfmt):
        raise ElfError(f"section header entry size {shentsize} too small")

    def header(i: int) -> tuple[int, ...]:
        at = shoff + i * shentsize
        raw = src.read_at(at, shentsize)
        if len(raw) < shentsize:
            raise ElfError(f"section header {i} lies past the end of the file")
        return _unpack(shfmt, raw, 0, f"section header {i}")

    first = header(0)
    if shnum == 0:  # extended numbering: the real count is in section 0's sh_size
        shnum = first[5]
    if shstrndx == SHN_XINDEX:
        shstrndx = first[6]
    if shnum > MAX_SECTIONS or shoff + shnum * shentsize > src.size:
        raise ElfError(f"{shnum} section headers at offset {shoff} run past the end of the file")
    table = src.read_at(shoff, shnum * shentsize)
    raw = [_unpack(shfmt, table, i * shentsize, f"section header {i}") for i in range(shnum)]
    if shstrndx >= shnum:
        raise ElfError(f"section name table index {shstrndx} out of range ({shnum} sections)")
    names_hdr = raw[shstrndx]
    names = _table(src, names_hdr[4], names_hdr[5], "section name table")
    sections = []
    for h in raw:
        name_off, sh_type, _flags, _addr, offset, size, link = h[:7]
        if sh_type != SHT_NOBITS and offset + size > src.size:
            raise ElfError(f"section at offset {offset} size {size} runs past the end of the file")
        name = _cstr(names, name_off, "section name", cut=MAX_NAME) if name_off < len(names) else ""
        sections.append(Section(name, sh_type, offset, size, link))
    return ElfFile(bits, e, machine, tuple(sections))


# A name is read at most this far from its offset: each lookup costs O(MAX_NAME), not
# O(table), so a table with one NUL at its end under thousands of symbols is linear, not
# quadratic. Defaults: a library or version name longer than MAX_NAME is an error; a
# symbol name (it only says which symbol sets a floor) is kept cut at MAX_SYMBOL bytes.
MAX_NAME = 4096
MAX_SYMBOL = 1024


def _cstr(table: bytes, off: int, what: str, *, cut: int = 0) -> str:
    """The NUL-terminated string at ``off``: out of range is an ElfError, and so is one
    longer than MAX_NAME; with ``cut``, a longer one is its first ``cut`` bytes and '...'."""
    if off >= len(table):
        raise ElfError(f"{what} string offset {off} out of range")
    limit = cut or MAX_NAME
    end = table.find(b"\0", off, off + limit + 1)
    if end < 0:
        if len(table) - off > limit:
            if not cut:
                raise ElfError(f"{what} string at offset {off} is longer than {MAX_NAME} bytes")
            return table[off : off + cut].decode("utf-8", "replace") + "..."
        end = len(table)
    return table[off:end].decode("utf-8", "replace")


def _table(src: Reader, offset: int, size: int, what: str) -> bytes:
    if size > MAX_TABLE:
        raise ElfError(f"{what} is {size} bytes (more than {MAX_TABLE})")
    if offset + size > src.size:
        raise ElfError(f"{what} at offset {offset} size {size} runs past the end of the file")
    return src.read_at(offset, size)


def dynamic(elf: ElfFile, blob: bytes | bytearray | memoryview | Reader) -> Dynamic:
    """DT_NEEDED, DT_RPATH, DT_RUNPATH and DT_SONAME from the SHT_DYNAMIC section."""
    src = as_reader(blob)
    dyn = next((s for s in elf.sections if s.type == SHT_DYNAMIC), None)
    if dyn is None:
        return Dynamic((), (), (), None)
    if dyn.link >= len(elf.sections):
        raise ElfError(f"dynamic section links to missing string table {dyn.link}")
    link = elf.sections[dyn.link]
    strtab = b"" if link.type == SHT_NOBITS else _table(src, link.offset, link.size, ".dynstr")
    fmt = elf.endian + ("qQ" if elf.bits == 64 else "iI")
    step = struct.calcsize(fmt)
    data = _table(src, dyn.offset, dyn.size, "dynamic section")

    def string(off: int) -> str:
        return _cstr(strtab, off, "dynamic")

    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname = None
    for at in range(0, len(data) - step + 1, step):
        tag, val = struct.unpack_from(fmt, data, at)
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            needed.append(string(val))
        elif tag == DT_RPATH:
            rpath.extend(p for p in string(val).split(":") if p)
        elif tag == DT_RUNPATH:
            runpath.extend(p for p in string(val).split(":") if p)
        elif tag == DT_SONAME:
            soname = string(val)
    return Dynamic(tuple(needed), tuple(rpath), tuple(runpath), soname)


@dataclass(frozen=True)
class VersionNeed:
    """One versioned requirement: ``GLIBC_2.34`` from ``libc.so.6``, and the undefined
    dynamic symbols bound to it (``pthread_create``...)."""

    library: str
    version: str
    symbols: tuple[str, ...]


def version_needs(
    elf: ElfFile, blob: bytes | bytearray | memoryview | Reader
) -> tuple[VersionNeed, ...]:
    """The SHT_GNU_verneed chain, with the undefined symbols that use each version.

    What the dynamic loader checks at load time: an object that needs ``GLIBC_2.34``
    does not load where libc.so.6 does not define that version.
    """
    src = as_reader(blob)
    verneed = next((s for s in elf.sections if s.type == SHT_GNU_VERNEED), None)
    if verneed is None:
        return ()
    if verneed.link >= len(elf.sections):
        raise ElfError(f".gnu.version_r links to missing string table {verneed.link}")
    strsec = elf.sections[verneed.link]
    strtab = _table(src, strsec.offset, strsec.size, ".gnu.version_r string table")
    data = _table(src, verneed.offset, verneed.size, ".gnu.version_r")
    e = elf.endian

    def string(off: int) -> str:
        return _cstr(strtab, off, "version")

    by_index: dict[int, tuple[str, str]] = {}  # vna_other (version index) -> (library, version)
    order: list[int] = []
    at, seen = 0, 0
    while True:
        _ver, cnt, file_off, aux, nxt = _unpack(e + "HHIII", data, at, "verneed entry")
        library = string(file_off)
        aux_at = at + aux
        for _ in range(cnt):
            seen += 1
            if seen > MAX_VERNEED:
                raise ElfError(f"more than {MAX_VERNEED} version requirements")
            _hash, _flags, other, name_off, aux_next = _unpack(
                e + "IHHII", data, aux_at, "vernaux entry"
            )
            by_index[other] = (library, string(name_off))
            order.append(other)
            if not aux_next:
                break
            aux_at += aux_next
        if not nxt:
            break
        at += nxt
        if at >= len(data):
            raise ElfError("verneed chain runs past its section")
    symbols: dict[int, set[str]] = {i: set() for i in by_index}
    for name, index in _undefined_symbol_versions(elf, src, set(by_index)):
        symbols[index].add(name)
    return tuple(
        VersionNeed(by_index[i][0], by_index[i][1], tuple(sorted(symbols[i]))) for i in order
    )


def _undefined_symbol_versions(
    elf: ElfFile, src: Reader, wanted: set[int] | None = None
) -> list[tuple[str, int]]:
    """(name, version index) of each undefined .dynsym symbol bound to a ``wanted`` version
    index (all when None); [] without .gnu.version. Each name is read once per offset."""
    dynsym = next((s for s in elf.sections if s.type == SHT_DYNSYM), None)
    versym = next((s for s in elf.sections if s.type == SHT_GNU_VERSYM), None)
    if dynsym is None or versym is None or dynsym.link >= len(elf.sections):
        return []
    strsec = elf.sections[dynsym.link]
    strtab = _table(src, strsec.offset, strsec.size, ".dynstr")
    syms = _table(src, dynsym.offset, dynsym.size, ".dynsym")
    versions = _table(src, versym.offset, versym.size, ".gnu.version")
    if elf.bits == 64:
        fmt, name_at, shndx_at = elf.endian + "IBBHQQ", 0, 3
    else:
        fmt, name_at, shndx_at = elf.endian + "IIIBBH", 0, 5
    step = struct.calcsize(fmt)
    out: list[tuple[str, int]] = []
    names: dict[int, str] = {}
    for i in range(1, min(len(syms) // step, len(versions) // 2)):
        fields = struct.unpack_from(fmt, syms, i * step)
        if fields[shndx_at] != SHN_UNDEF:
            continue
        (index,) = struct.unpack_from(elf.endian + "H", versions, i * 2)
        index &= 0x7FFF  # bit 15: hidden
        name_off = fields[name_at]
        if (wanted is not None and index not in wanted) or name_off >= len(strtab):
            continue
        name = names.get(name_off)
        if name is None:
            name = names[name_off] = _cstr(strtab, name_off, "symbol", cut=MAX_SYMBOL)
        out.append((name, index))
    return out
