"""Which members of two wheels differ: bytes, presence, zip metadata, order.

One implementation for ``verify-build`` and ``pinwheel kernels --twice``.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MemberDiff:
    member: str
    change: str  # "differs" | "only in recorded" | "only in rebuilt"


def diff_members(a: Path, b: Path) -> tuple[MemberDiff, ...]:
    """Zip members whose bytes or metadata (time, mode) differ between two wheels."""
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        diffs = [MemberDiff(n, "only in recorded") for n in sorted(ia.keys() - ib.keys())]
        diffs += [MemberDiff(n, "only in rebuilt") for n in sorted(ib.keys() - ia.keys())]
        for name in sorted(ia.keys() & ib.keys()):
            x, y = ia[name], ib[name]
            if x.CRC != y.CRC or x.file_size != y.file_size or za.read(x) != zb.read(y):
                diffs.append(MemberDiff(name, "differs"))
            elif (x.date_time, x.external_attr) != (y.date_time, y.external_attr):
                diffs.append(MemberDiff(name, "differs (zip metadata: time or mode)"))
        if not diffs and [i.filename for i in za.infolist()] != [i.filename for i in zb.infolist()]:
            diffs.append(MemberDiff("(member order)", "differs"))
    return tuple(diffs)
