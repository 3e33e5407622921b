"""Read the CUDA fat binaries in an ELF ``.nv_fatbin`` section: which arches have SASS, which PTX.

Layout (little-endian, as written by nvcc/fatbinary; verified against nvcc
12.4 and 13.0 output): a section holds one fatbin per device-linked unit,
each 8-byte aligned::

    fatbin header (16 B): u32 magic 0xBA55ED50, u16 version, u16 header_size,
                          u64 size of the entries that follow
    entry header (>=64 B): u16 kind (1 PTX, 2 ELF/SASS), u16 version,
                          u32 header_size, u64 payload_size, u32 compressed_size,
                          u32 _, u16 minor, u16 major, u32 arch (70 = sm_70),
                          u32 name_offset, u32 name_len, u64 flags, u64 _,
                          u64 uncompressed_size
    payload (payload_size B), then the next entry

Compressed payloads keep their arch in the clear, so nothing is decompressed, and only
headers are read: a section of hundreds of MB costs a few KB of memory.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pinwheel.wheels.elf import Reader, as_reader

FATBIN_MAGIC = 0xBA55ED50
SECTIONS = (".nv_fatbin", "__nv_relfatbin")  # linked, and relocatable (-rdc) objects
KIND_PTX, KIND_ELF = 1, 2
KINDS = {KIND_PTX: "ptx", KIND_ELF: "sass"}
# 0x2000: the original (LZ4-style) compression; 0x8000: the newer one (CUDA 12.8+/13).
FLAG_COMPRESSED = 0x2000 | 0x8000
_FATBIN = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")  # 64 bytes


class FatbinError(ValueError):
    """Malformed fatbin data (the caller adds which file and section)."""


@dataclass(frozen=True)
class Entry:
    kind: str  # "sass" | "ptx" | "kind<N>"
    arch: int  # 70 for sm_70 / compute_70
    compressed: bool
    size: int  # payload bytes as stored


@dataclass(frozen=True)
class Fatbin:
    offset: int  # within the section
    entries: tuple[Entry, ...]

    @property
    def sass(self) -> frozenset[int]:
        return frozenset(e.arch for e in self.entries if e.kind == "sass")

    @property
    def ptx(self) -> frozenset[int]:
        return frozenset(e.arch for e in self.entries if e.kind == "ptx")


def parse_section(
    data: bytes | bytearray | memoryview | Reader, offset: int = 0, size: int | None = None
) -> tuple[Fatbin, ...]:
    """The fatbins in a section: ``data`` is the section's bytes, or a file :class:`Reader`
    with the section at ``offset`` (``size`` bytes). Only headers are read, never payloads."""
    src = as_reader(data)
    base = offset
    limit = src.size - base if size is None else size
    if base < 0 or limit < 0 or base + limit > src.size:
        raise FatbinError(f"section at offset {base} size {limit} runs past the end of the file")
    fatbins: list[Fatbin] = []
    pos = 0
    while pos + _FATBIN.size <= limit:
        head = src.read_at(base + pos, _FATBIN.size)
        magic, _version, header_size, body = _FATBIN.unpack_from(head)
        if magic != FATBIN_MAGIC:
            if not any(head[:8]):  # alignment padding between fatbins: skip the zero run
                pos = _skip_zeros(src, base, pos, limit)
                continue
            raise FatbinError(f"bad fatbin magic 0x{magic:08x} at offset {pos}")
        if header_size < _FATBIN.size:
            raise FatbinError(f"fatbin header size {header_size} at offset {pos}")
        start, end = pos + header_size, pos + header_size + body
        if end > limit:
            raise FatbinError(f"fatbin at offset {pos} claims {body} bytes, section has fewer")
        fatbins.append(Fatbin(pos, _entries(src, base, start, end)))
        pos = end
    return tuple(fatbins)


def _skip_zeros(src: Reader, base: int, pos: int, limit: int) -> int:
    """The first 8-aligned offset at or after ``pos`` whose 8 bytes are not all zero."""
    while pos < limit:
        window = src.read_at(base + pos, min(64 * 1024, limit - pos))
        if not window:
            return limit
        for at in range(0, len(window) - len(window) % 8, 8):
            if any(window[at : at + 8]):
                return pos + at
        pos += len(window) - len(window) % 8 or len(window)
    return limit


def _entries(src: Reader, base: int, at: int, end: int) -> tuple[Entry, ...]:
    entries: list[Entry] = []
    while at < end:
        if at + _ENTRY.size > end:
            raise FatbinError(f"truncated fatbin entry header at offset {at}")
        (kind, _v, header_size, size, csize, _u, _minor, _major, arch, _no, _nl, flags, _z, _d) = (
            _ENTRY.unpack_from(src.read_at(base + at, _ENTRY.size))
        )
        if header_size < _ENTRY.size or at + header_size + size > end:
            raise FatbinError(
                f"fatbin entry at offset {at}: header {header_size} + payload {size} "
                f"overruns its fatbin (ends at {end})"
            )
        compressed = bool(flags & FLAG_COMPRESSED) or csize != 0
        entries.append(Entry(KINDS.get(kind, f"kind{kind}"), arch, compressed, size))
        at += header_size + size
    return tuple(entries)
