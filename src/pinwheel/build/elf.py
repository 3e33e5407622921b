"""A minimal ELF reader: section headers, one section's bytes, and the dynamic section.

Pure Python so the artifact check runs on a machine with no binutils and no
NVIDIA tools. It reads only what the check needs (``.nv_fatbin`` and
DT_NEEDED/DT_RPATH/DT_RUNPATH) and rejects anything malformed with
:class:`ElfError` rather than guessing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
SHT_NOBITS = 8
SHT_DYNAMIC = 6
DT_NULL, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 14, 15, 29
SHN_XINDEX = 0xFFFF


class ElfError(ValueError):
    """The bytes are not a well-formed ELF file (the caller adds which file)."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int

    def data(self, blob: bytes | memoryview) -> memoryview:
        if self.type == SHT_NOBITS:
            return memoryview(b"")
        return memoryview(blob)[self.offset : self.offset + self.size]


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


def is_elf(blob: bytes | memoryview) -> bool:
    return bytes(blob[:4]) == ELF_MAGIC


def parse(blob: bytes | memoryview) -> ElfFile:
    view = memoryview(blob)
    if len(view) < 52 or bytes(view[:4]) != ELF_MAGIC:
        raise ElfError("not an ELF file (bad magic)")
    klass, data = view[4], view[5]
    if klass not in (1, 2) or data not in (1, 2):
        raise ElfError(f"unknown ELF class/encoding {klass}/{data}")
    bits = 64 if klass == 2 else 32
    e = "<" if data == 1 else ">"
    if bits == 64:
        (machine,) = struct.unpack_from(e + "H", view, 18)
        (shoff,) = struct.unpack_from(e + "Q", view, 40)
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", view, 58)
        shfmt = e + "IIQQQQIIQQ"
    else:
        (machine,) = struct.unpack_from(e + "H", view, 18)
        (shoff,) = struct.unpack_from(e + "I", view, 32)
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", view, 46)
        shfmt = e + "IIIIIIIIII"
    if shoff == 0:
        return ElfFile(bits, e, machine, ())  # no section headers (sstrip'ed)
    if shentsize < struct.calcsize(shfmt):
        raise ElfError(f"section header entry size {shentsize} too small")

    def header(i: int) -> tuple[int, ...]:
        at = shoff + i * shentsize
        if at + shentsize > len(view):
            raise ElfError(f"section header {i} lies past the end of the file")
        return struct.unpack_from(shfmt, view, at)

    first = header(0)
    if shnum == 0:  # extended numbering: the real count is in section 0's sh_size
        shnum = first[5]
    if shstrndx == SHN_XINDEX:
        shstrndx = first[6]
    raw = [header(i) for i in range(shnum)]
    if shstrndx >= shnum:
        raise ElfError(f"section name table index {shstrndx} out of range ({shnum} sections)")
    names_hdr = raw[shstrndx]
    names = bytes(view[names_hdr[4] : names_hdr[4] + names_hdr[5]])
    sections = []
    for h in raw:
        name_off, sh_type, _flags, _addr, offset, size, link = h[:7]
        if sh_type != SHT_NOBITS and offset + size > len(view):
            raise ElfError(f"section at offset {offset} size {size} runs past the end of the file")
        end = names.find(b"\0", name_off)
        name = names[name_off : end if end >= 0 else None].decode("utf-8", "replace")
        sections.append(Section(name, sh_type, offset, size, link))
    return ElfFile(bits, e, machine, tuple(sections))


def dynamic(elf: ElfFile, blob: bytes | memoryview) -> Dynamic:
    """DT_NEEDED, DT_RPATH, DT_RUNPATH and DT_SONAME from the SHT_DYNAMIC section."""
    dyn = next((s for s in elf.sections if s.type == SHT_DYNAMIC), None)
    if dyn is None:
        return Dynamic((), (), (), None)
    if dyn.link >= len(elf.sections):
        raise ElfError(f"dynamic section links to missing string table {dyn.link}")
    strtab = bytes(elf.sections[dyn.link].data(blob))
    fmt = elf.endian + ("qQ" if elf.bits == 64 else "iI")
    step = struct.calcsize(fmt)
    data = dyn.data(blob)

    def string(off: int) -> str:
        if off >= len(strtab):
            raise ElfError(f"dynamic string offset {off} out of range")
        end = strtab.find(b"\0", off)
        return strtab[off : end if end >= 0 else None].decode("utf-8", "replace")

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
