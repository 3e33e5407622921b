"""The oldest C library a wheel loads against: its floor, read from the versioned symbols.

A shared object linked on a new distribution asks the dynamic loader for symbol
versions (``pthread_create@GLIBC_2.34``); on a machine whose libc.so.6 lacks that
version it fails at import with ``version `GLIBC_2.34' not found``. The floor of a
wheel is, per family, the highest version any ELF member needs:

- ``GLIBC``   from libc.so.6, libm.so.6, libpthread.so.0, ... (the glibc release)
- ``GLIBCXX`` from libstdc++.so.6 (the GCC runtime's C++ library)
- ``CXXABI``  from libstdc++.so.6 (its C++ ABI)

Each figure keeps the member and one symbol that sets it, so a failing gate names
what to fix. Versions compare as integer tuples (``2.9`` < ``2.17`` < ``2.34``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pinwheel.wheels.elf import VersionNeed

FAMILIES = ("GLIBC", "GLIBCXX", "CXXABI")
# ASCII digits only (``\d`` would take ``GLIBC_2.١٧`` for 2.17), at most 4 parts of at
# most 9 digits (glibc's own are 2.x, GLIBCXX 3.4.x): anything else is no version.
_FAMILY = re.compile(r"(GLIBC|GLIBCXX|CXXABI)_(.*)", re.S)
_VERSION = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,3}", re.ASCII)

Version = tuple[int, ...]


def parse_version(text: str, *, what: str = "version") -> Version:
    """``"2.31"`` -> ``(2, 31)``; anything else is a ValueError naming ``what``."""
    if not isinstance(text, str) or not _VERSION.fullmatch(text):
        shown = text if not isinstance(text, str) or len(text) <= 40 else text[:37] + "..."
        raise ValueError(
            f"{what} must look like 2.31 (1 to 4 groups of ASCII digits), not {shown!r}"
        )
    return tuple(int(p) for p in text.split("."))


def show(version: Version) -> str:
    return ".".join(str(p) for p in version)


@dataclass(frozen=True)
class Requirement:
    """The highest version of one family a wheel needs, and where that comes from."""

    family: str  # GLIBC | GLIBCXX | CXXABI
    version: Version
    member: str  # the wheel member (or file) that needs it
    symbol: str | None  # one undefined symbol bound to that version (None: no symbol uses it)
    library: str  # the library that must define it (libc.so.6, libstdc++.so.6)

    @property
    def name(self) -> str:
        return f"{self.family}_{show(self.version)}"

    def describe(self) -> str:
        via = f" ({self.symbol})" if self.symbol else ""
        return f"{self.name}{via} from {self.library}, needed by {self.member}"


@dataclass(frozen=True)
class Floor:
    """Per family, the highest requirement over all members; empty for a pure-Python wheel."""

    requirements: tuple[Requirement, ...] = ()

    def get(self, family: str) -> Requirement | None:
        return next((r for r in self.requirements if r.family == family), None)

    @property
    def glibc(self) -> Version | None:
        req = self.get("GLIBC")
        return req.version if req else None

    def to_json(self) -> dict[str, object]:
        return {
            r.family: {
                "version": show(r.version),
                "member": r.member,
                "symbol": r.symbol,
                "library": r.library,
            }
            for r in self.requirements
        }

    def summary(self) -> str:
        return ", ".join(r.name for r in self.requirements) or "none (no versioned symbols)"


def requirements(member: str, needs: Iterable[VersionNeed]) -> list[Requirement]:
    """Every family requirement of one ELF member (``GLIBC_PRIVATE`` and others skipped).

    A family name whose tail starts with a digit of any script but is not a version
    (``GLIBC_2.3.4.5.6``, ``GLIBC_2.<5,000 digits>``, ``GLIBC_2.١٧``) is a ValueError:
    the loader would look for exactly that name, so no floor can be read from it."""
    out: list[Requirement] = []
    for need in needs:
        m = _FAMILY.fullmatch(need.version)
        if not m or not m.group(2)[:1].isdigit():
            continue  # GLIBC_PRIVATE, GLIBCXX_TUNABLES: not a release
        version = parse_version(m.group(2), what=f"{m.group(1)} version of {need.library}")
        symbol = need.symbols[0] if need.symbols else None
        out.append(Requirement(m.group(1), version, member, symbol, need.library))
    return out


def floor(per_member: Mapping[str, Iterable[VersionNeed]]) -> Floor:
    """The highest requirement per family; ties go to the first member by name."""
    best: dict[str, Requirement] = {}
    for member in sorted(per_member):
        for req in requirements(member, per_member[member]):
            held = best.get(req.family)
            if held is None or req.version > held.version:
                best[req.family] = req
    return Floor(tuple(best[f] for f in FAMILIES if f in best))


def merge(floors: Iterable[Floor]) -> Floor:
    """The floor of several wheels together (a release set)."""
    best: dict[str, Requirement] = {}
    for f in floors:
        for req in f.requirements:
            held = best.get(req.family)
            if held is None or req.version > held.version:
                best[req.family] = req
    return Floor(tuple(best[f] for f in FAMILIES if f in best))


def host_glibc() -> Version | None:
    """This machine's glibc (``os.confstr``), None where the C library is not glibc."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    name, _, version = text.partition(" ")
    if name != "glibc":
        return None
    try:
        return parse_version(version)
    except ValueError:
        return None
