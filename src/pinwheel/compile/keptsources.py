"""A kept engine workspace's build sources, reused when their pins hold and their files do.

``pinwheel build`` exported every ``[[build.source]]`` again on every build (git
archive of cutlass and of the flash-attention fork with its cutlass submodule: about
7,000 files and 150 MB each, 11 s apiece on two cores) only to find, file by file,
that nothing had changed. A source exported into ``<work>/deps/<name>`` now leaves a
record beside it: its key (everything that decides its bytes: URL, commit, excludes,
submodule pins, the bytes of its patches, this module's format) and every file's
stamp: size, mode, link target, mtime, ctime, inode and device
(:mod:`pinwheel.compile.stamps`' rule). The next build with the same key checks the
files against the record by ``lstat`` alone: a file written since has another mtime or
ctime (``utime`` cannot set ctime back, so an edit of the same size with its mtime reset
is caught), a replaced one another inode, and any difference, or a file more or less,
exports the source again. The bytes are not read again: re-hashing both sources (300 MB)
was most of a no-change build's time (about 9 s of it on two busy cores).

In: the :class:`~pinwheel.manifest.build.BuildSource` and the replayed tree holding its
patches. Out: the :class:`~pinwheel.compile.sources.Supplied` of last time, or None.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pinwheel import confine, untrusted, validate
from pinwheel.compile import derivation
from pinwheel.compile.sources import Supplied
from pinwheel.compile.workspace import SOURCE_MTIME
from pinwheel.errors import PinwheelError
from pinwheel.manifest.build import BuildSource

FORMAT = 2  # bump when the export of a build source, or its record, changes


def record_path(work: Path, name: str) -> Path:
    return work / f"deps-{name}.kept.json"


def key_of(src: BuildSource, project: Path) -> str:
    """Everything that decides the exported bytes of ``src``."""
    patches = []
    for rel in src.patches:
        patch = project / rel
        digest = hashlib.sha256(patch.read_bytes()).hexdigest() if patch.is_file() else None
        patches.append([rel, digest])
    facts = {
        "format": FORMAT,
        "source": {k: v for k, v in dataclasses.asdict(src).items() if k != "used"},
        "patches": patches,
    }
    return derivation.digest(facts)


def _files(root: Path) -> dict[str, list[Any]] | None:
    """rel -> [size, executable, link target, mtime_ns, ctime_ns, inode, device] of every
    file under ``root``; None when a file does not carry the fixed mtime (something wrote
    it after the export), or the tree holds what no export makes (a link leading out, a
    FIFO: :func:`confine.walk`)."""
    out: dict[str, list[Any]] = {}
    try:
        for node in confine.walk(root):
            if node.kind == "link":
                out[node.rel] = [0, False, node.link]
            elif node.kind == "file":
                st = os.lstat(root / node.rel)
                if int(st.st_mtime) != SOURCE_MTIME:
                    return None
                out[node.rel] = [st.st_size, bool(st.st_mode & 0o100), None, st.st_mtime_ns,
                                 st.st_ctime_ns, st.st_ino, st.st_dev]  # fmt: skip
    except confine.Escape:
        return None
    return out


def remember(work: Path, key: str, supplied: Supplied) -> None:
    """After ``supplied`` was exported into ``work/deps/<name>``: the record for next time."""
    files = _files(supplied.path)
    if files is None:  # not the fixed times: never reused
        record_path(work, supplied.name).unlink(missing_ok=True)
        return
    fields = dataclasses.asdict(supplied)
    fields.pop("path")
    payload = {"key": key, "supplied": fields, "files": files}
    path = record_path(work, supplied.name)  # a link planted there replaced, never followed
    confine.write_beneath(path.parent, path.name, json.dumps(payload, sort_keys=True).encode())


def kept(work: Path, src: BuildSource, project: Path) -> Supplied | None:
    """Last build's ``src`` in ``work/deps/<name>`` when its key and files still hold."""
    final = work / "deps" / src.name
    record, kind = record_path(work, src.name), untrusted.EXPORT_STAMP
    try:  # bounded, never through a link, no FIFO waited on
        payload = untrusted.parse_json(untrusted.read_beneath(work, record.name, kind),
                                       kind, str(record))  # fmt: skip
        if payload["key"] != key_of(src, project) or not final.is_dir():
            return None
        # Every file's stamp as recorded right after the export: the bytes are those the
        # recorded digest (provenance's) was taken of, without reading them again.
        if _files(final) != payload["files"]:
            return None
        fields = payload["supplied"]
        if (fields["name"], fields["url"]) != (src.name, src.url):
            return None  # not this source's record: what provenance would say comes from it
        if not validate.is_sha256(fields["sha256"]):
            return None
        return Supplied(
            name=fields["name"], path=final, url=fields["url"], commit=fields["commit"],
            ref=fields["ref"], tree=fields["tree"], sha256=fields["sha256"],
            patches=tuple(tuple(p) for p in fields["patches"]),
            submodules=tuple(tuple(s) for s in fields["submodules"]),
            excluded=tuple(fields["excluded"]), omitted=fields["omitted"],
            reason=fields["reason"], variables=tuple(fields["variables"]),
        )  # fmt: skip
    except (PinwheelError, OSError, ValueError, KeyError, TypeError):
        return None
