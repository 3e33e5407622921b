"""Small ELF64 shared objects written byte by byte, for the hostile cases a compiler will
not produce: a version name of 5,000 digits, a string table with one NUL at its end
under thousands of symbols. Layout is the System V gABI's (section headers, .dynstr,
.dynsym, .gnu.version, .gnu.version_r); ``readelf -V`` reads what this writes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

SHT_STRTAB, SHT_DYNSYM = 3, 11
SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFE, 0x6FFFFFFF


def _section(name: int, kind: int, offset: int, size: int, link: int = 0, info: int = 0,
             entsize: int = 0) -> bytes:  # fmt: skip
    return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, link, info, 1, entsize)


def shared_object(
    needs: Sequence[tuple[str, str]],
    symbols: Sequence[tuple[bytes, int]] = (),
    *,
    tail: bytes = b"",
    tail_offsets: Sequence[int] | None = None,
) -> bytes:
    """An ELF64 little-endian ET_DYN whose .gnu.version_r lists ``needs`` ((library,
    version) pairs, version index 2, 3, ...), and whose .dynsym holds undefined
    ``symbols`` ((name, version index)). ``tail`` is appended to the string table and
    ``tail_offsets`` name the symbols at offsets into it (tables no linker writes)."""
    strings = bytearray(b"\0")
    offsets: dict[bytes, int] = {}

    def add(s: bytes) -> int:
        if s not in offsets:
            offsets[s] = len(strings)
            strings.extend(s + b"\0")
        return offsets[s]

    by_lib: dict[str, list[tuple[str, int]]] = {}
    for i, (lib, version) in enumerate(needs):
        by_lib.setdefault(lib, []).append((version, i + 2))
    verneed = bytearray()
    libs = list(by_lib)
    for n, lib in enumerate(libs):
        entries = by_lib[lib]
        file_off = add(lib.encode())
        nxt = 16 + 16 * len(entries) if n + 1 < len(libs) else 0
        verneed += struct.pack("<HHIII", 1, len(entries), file_off, 16, nxt)
        for k, (version, index) in enumerate(entries):
            name_off = add(version.encode())
            more = 16 if k + 1 < len(entries) else 0
            verneed += struct.pack("<IHHII", 0, 0, index, name_off, more)
    sym_names = [add(name) for name, _ in symbols]
    if tail_offsets is not None:
        sym_names = [len(strings) + off for off in tail_offsets]
    table = bytes(strings) + tail
    dynsym = bytearray(b"\0" * 24)  # symbol 0 is the null symbol
    versym = bytearray(b"\0\0")
    for off, (_, index) in zip(sym_names, symbols, strict=True):
        dynsym += struct.pack("<IBBHQQ", off, 0x12, 0, 0, 0, 0)  # GLOBAL FUNC, SHN_UNDEF
        versym += struct.pack("<H", index)
    shstr = b"\0.dynstr\0.dynsym\0.gnu.version\0.gnu.version_r\0.shstrtab\0"

    def name(s: bytes) -> int:
        return shstr.index(s + b"\0")

    blobs = [table, bytes(dynsym), bytes(versym), bytes(verneed), shstr]
    at, placed = 64, []
    for blob in blobs:
        placed.append(at)
        at += len(blob)
    shoff = at
    sections = [
        b"\0" * 64,
        _section(name(b".dynstr"), SHT_STRTAB, placed[0], len(table)),
        _section(name(b".dynsym"), SHT_DYNSYM, placed[1], len(dynsym), link=1, info=1, entsize=24),
        _section(name(b".gnu.version"), SHT_GNU_VERSYM, placed[2], len(versym), link=2, entsize=2),
        _section(
            name(b".gnu.version_r"),
            SHT_GNU_VERNEED,
            placed[3],
            len(verneed),
            link=1,
            info=len(libs),
        ),  # fmt: skip
        _section(name(b".shstrtab"), SHT_STRTAB, placed[4], len(shstr)),
    ]
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, 6, 5)
    return header + b"".join(blobs) + b"".join(sections)


def string_table_bomb(size: int) -> bytes:
    """An ELF of about ``size`` bytes: half a string table with one NUL at its end, half
    undefined symbols named at successive offsets into it (each name runs to that NUL)."""
    half = size // 2
    count = half // 26  # 24 bytes of .dynsym and 2 of .gnu.version per symbol
    return shared_object(
        [("libc.so.6", "GLIBC_2.17")],
        [(b"", 2)] * count,
        tail=b"A" * (half - 1) + b"\0",
        tail_offsets=range(count),
    )
