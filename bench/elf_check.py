"""The ELF symbol-version reader on a string-table bomb: the old path against the new.

The bomb (tests/elfmaker.py) is an ELF of N bytes: half a string table with one NUL
at its end, half undefined symbols named at successive offsets into it. The old
reader scanned for the NUL from each symbol's offset and copied the rest of the
table for every symbol (quadratic in N); the new one reads at most MAX_SYMBOL bytes
per name, once per offset (linear). Both run in this process on the same bytes; the
old one is this file's verbatim copy of the code it replaces (pinwheel 0e3240b).

    python bench/elf_check.py [--sizes 131072,262144,524288] [--new-only 4194304]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import elfmaker  # noqa: E402
from pinwheel.wheels import elf  # noqa: E402


def old_undefined_symbol_versions(image: elf.ElfFile, blob: bytes) -> list[tuple[str, int]]:
    """pinwheel 0e3240b's _undefined_symbol_versions, unchanged but for the reader."""
    src = elf.as_reader(blob)
    dynsym = next((s for s in image.sections if s.type == elf.SHT_DYNSYM), None)
    versym = next((s for s in image.sections if s.type == elf.SHT_GNU_VERSYM), None)
    if dynsym is None or versym is None or dynsym.link >= len(image.sections):
        return []
    strsec = image.sections[dynsym.link]
    strtab = elf._table(src, strsec.offset, strsec.size, ".dynstr")
    syms = elf._table(src, dynsym.offset, dynsym.size, ".dynsym")
    versions = elf._table(src, versym.offset, versym.size, ".gnu.version")
    fmt, name_at, shndx_at = image.endian + "IBBHQQ", 0, 3
    step = struct.calcsize(fmt)
    out: list[tuple[str, int]] = []
    for i in range(min(len(syms) // step, len(versions) // 2)):
        fields = struct.unpack_from(fmt, syms, i * step)
        if fields[shndx_at] != elf.SHN_UNDEF or i == 0:
            continue
        (index,) = struct.unpack_from(image.endian + "H", versions, i * 2)
        index &= 0x7FFF
        name_off = fields[name_at]
        end = strtab.find(b"\0", name_off)
        if name_off >= len(strtab):
            continue
        out.append((strtab[name_off : end if end >= 0 else None].decode("utf-8", "replace"), index))
    return out


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="131072,262144,524288")
    ap.add_argument("--new-only", default="4194304", help="sizes only the new path runs at")
    args = ap.parse_args()
    print(f"{'bytes':>10} {'symbols':>8} {'old s':>9} {'new s':>9} {'old/new':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        bomb = elfmaker.string_table_bomb(size)
        image = elf.parse(bomb)
        old = timed(old_undefined_symbol_versions, image, bomb)
        new = timed(elf._undefined_symbol_versions, image, elf.as_reader(bomb))
        count = (size // 2) // 26
        print(f"{len(bomb):>10} {count:>8} {old:>9.3f} {new:>9.3f} {old / new:>8.1f}")
    for size in (int(s) for s in args.new_only.split(",") if s):
        bomb = elfmaker.string_table_bomb(size)
        new = timed(lambda b: elf.version_needs(elf.parse(b), b), bomb)
        print(f"{len(bomb):>10} {(size // 2) // 26:>8} {'(not run)':>9} {new:>9.3f}")


if __name__ == "__main__":
    main()
