"""The one archive reader: zip (wheels) and tar (toolchain tarballs, a .deb's data.tar, exports).

Every member is judged before a byte of it is written: no absolute name, no
``..``, no drive letter, no NUL or control character, no link (symlink or
hard link) — members are plain files and directories — no device, FIFO or
socket, and size and count limits (a zip bomb or a tar bomb is refused from
its headers). Extraction writes through :mod:`pinwheel.confine`, so even a
symlink planted in the destination cannot lead a member out.

The wheel-specific audit (RECORD hashes, CRCs, ELF checks) stays in
:mod:`pinwheel.wheels.wheelfile` and :mod:`pinwheel.wheels.check`; it uses the
same name rule (:func:`pinwheel.validate.member_problem`).
"""

from __future__ import annotations

import calendar
import os
import posixpath
import re
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pinwheel import confine, validate
from pinwheel.errors import VerifyError

MiB = 1024 * 1024
GiB = 1024 * MiB
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class Limits:
    members: int = 200_000  # entries in one archive
    member: int = 8 * GiB  # bytes of one member, unpacked
    total: int = 32 * GiB  # bytes of all members, unpacked
    ratio: float = 200.0  # unpacked / packed for a zip member larger than ratio_floor
    ratio_floor: int = 16 * MiB


class ArchiveError(VerifyError):
    """An archive member that must not be read or written."""


def zip_kind(info: zipfile.ZipInfo) -> str:
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


def _refuse(origin: str, member: str, problem: str) -> ArchiveError:
    return ArchiveError(
        f"refusing archive member {member[:200]!r}: {problem}",
        where=origin,
        next="do not use this archive; fetch it from its publisher again",
    )


def zip_members(
    zf: zipfile.ZipFile, origin: str, limits: Limits = Limits()
) -> list[zipfile.ZipInfo]:
    """Every member of ``zf``, checked (raises :class:`ArchiveError` on the first bad one)."""
    infos = zf.infolist()
    if len(infos) > limits.members:
        raise _refuse(origin, f"({len(infos)} members)", f"over the {limits.members} member limit")
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        problem = validate.member_problem(name)
        if problem:
            raise _refuse(origin, name, problem)
        norm = name.rstrip("/")
        if norm in seen:
            raise _refuse(origin, name, "duplicate member (readers disagree on which wins)")
        seen.add(norm)
        kind = zip_kind(info)
        if kind == "symlink":
            raise _refuse(origin, name, "symlink member (only plain files and directories)")
        if kind == "special":
            raise _refuse(origin, name, f"special file (mode 0o{info.external_attr >> 16:o})")
        if info.flag_bits & 0x1:
            raise _refuse(origin, name, "encrypted member")
        total += info.file_size
        if info.file_size > limits.member:
            raise _refuse(
                origin, name, f"unpacks to {info.file_size} bytes (limit {limits.member})"
            )
        if info.file_size > limits.ratio_floor and info.file_size > limits.ratio * max(
            info.compress_size, 1
        ):
            raise _refuse(origin, name, "compression ratio over the limit (zip bomb?)")
        if total > limits.total:
            raise _refuse(origin, name, f"archive unpacks to over {limits.total} bytes")
    return infos


def link_problem(name: str, target: str) -> str | None:
    """Why a symlink ``name -> target`` inside an archive would point out of it, else None."""
    if not target or target.startswith("/") or _DRIVE.match(target) or "\0" in target:
        return f"link to an absolute or empty target {target[:200]!r}"
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        return f"link out of the archive (-> {target[:200]!r})"
    return None


def tar_members(
    tar: tarfile.TarFile,
    origin: str,
    limits: Limits = Limits(),
    *,
    skip_links: bool = False,
    inner_links: bool = False,
) -> Iterator[tarfile.TarInfo]:
    """Members of ``tar`` as they stream by, each checked; only files and directories.

    ``skip_links``: links and special members are passed over (never written) instead of
    refused: a Debian package's data.tar holds library symlinks pinwheel does not copy.
    ``inner_links``: symlinks whose target stays inside the archive are kept (a source
    tree exported by ``git archive`` holds them); hard links, and symlinks out, are refused.
    """
    count = total = 0
    for member in tar:
        count += 1
        if count > limits.members:
            raise _refuse(origin, member.name, f"over the {limits.members} member limit")
        problem = validate.member_problem(member.name)
        if problem:
            raise _refuse(origin, member.name, problem)
        if skip_links and not (member.isfile() or member.isdir()):
            continue
        if inner_links and member.issym():
            why = link_problem(member.name, member.linkname)
            if why:
                raise _refuse(origin, member.name, why)
            yield member
            continue
        if member.issym() or member.islnk():
            raise _refuse(
                origin, member.name, f"link member (-> {member.linkname[:200]!r}); only files"
            )
        if not (member.isfile() or member.isdir()):
            raise _refuse(origin, member.name, "device, FIFO or other special member")
        total += member.size
        if member.size > limits.member:
            raise _refuse(origin, member.name, f"{member.size} bytes (limit {limits.member})")
        if total > limits.total:
            raise _refuse(origin, member.name, f"archive unpacks to over {limits.total} bytes")
        yield member


def _mode(bits: int) -> int:
    return 0o755 if bits & 0o111 else 0o644


def _write(
    dest: Path,
    rel: str,
    src: IO[bytes],
    executable: bool,
    mtime: float | None = None,
    writer: confine.TreeWriter | None = None,
) -> None:
    # The member's own time, as tar and unzip keep it: a toolkit unpacked on two machines
    # then has the same header mtimes (ptxas -lineinfo writes them into cubins). A time
    # outside 1970..2106 (a hostile or broken archive) is left at the time of writing.
    kept = mtime if mtime is not None and 0 <= mtime < 2**32 else None
    mode = 0o755 if executable else 0o644
    if writer is not None and writer.write(rel, src, mode, kept):
        return  # the plain case, through folders opened once (nothing resolved by path)
    out = confine.inside(dest, rel, what="archive member")
    confine.mkdirs(dest, out.parent)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        confine.remove(dest, out)
    with confine.open_append(dest, out) as fh:
        fh.truncate(0)
        shutil.copyfileobj(src, fh, 1 << 20)
    out.chmod(mode)
    if kept is not None:
        os.utime(out, (kept, kept))


def zip_mtime(info: zipfile.ZipInfo) -> float:
    """A zip member's DOS date and time, read as UTC (zip stores no zone)."""
    return float(calendar.timegm((*info.date_time, 0, 0, 0)))


Select = Callable[[str, bool], str | None]


def _target(name: str, is_dir: bool, origin: str, select: Select | None) -> str | None:
    """Where ``select`` puts a member (None: skipped), refused if that name is unsafe."""
    rel = select(name, is_dir) if select else name
    if rel is not None:
        problem = validate.member_problem(rel)
        if problem:
            raise _refuse(origin, rel, problem)
    return rel


def extract_zip(
    zf: zipfile.ZipFile,
    dest: Path,
    origin: str,
    *,
    select: Select | None = None,
    limits: Limits = Limits(),
) -> list[str]:
    """Write the checked members of ``zf`` under ``dest``; ``select(name, is_dir)`` maps a
    member to its relative target (None: skip). Returns the names written."""
    written = []
    with confine.TreeWriter(dest) as writer:
        for info in zip_members(zf, origin, limits):
            if zip_kind(info) == "dir":
                continue
            rel = _target(info.filename, False, origin, select)
            if rel is None:
                continue
            executable = bool(_mode((info.external_attr >> 16) & 0o777) & 0o111)
            with zf.open(info) as src:
                _write(dest, rel, src, executable, zip_mtime(info), writer)
            written.append(info.filename)
    return written


def extract_tar(
    tar: tarfile.TarFile,
    dest: Path,
    origin: str,
    *,
    select: Select | None = None,
    limits: Limits = Limits(),
    stop: Callable[[], bool] | None = None,
    skip_links: bool = False,
    inner_links: bool = False,
) -> list[str]:
    """Write the checked members of a (streamed) tar under ``dest``; like :func:`extract_zip`.

    ``stop`` is asked after each member: True ends the read early (what was wanted is out).
    """
    written = []
    written_rel: list[str] = []
    dir_rel: list[str] = []
    links: dict[str, str] = {}
    with confine.TreeWriter(dest) as writer:
        members = tar_members(
            tar, origin, limits, skip_links=skip_links, inner_links=inner_links
        )
        for member in members:
            name = member.name.removeprefix("./")
            rel = _target(name, member.isdir(), origin, select)
            if rel is not None:
                if member.issym():
                    # Made after every file: no later member can be written through it.
                    confine.inside(dest, rel, what="archive member")
                    links[rel] = member.linkname
                elif member.isdir():
                    if not writer.mkdir(rel):
                        confine.mkdirs(dest, confine.inside(dest, rel, what="archive member"))
                    dir_rel.append(rel)
                else:
                    src = tar.extractfile(member)
                    assert src is not None
                    _write(dest, rel, src, bool(member.mode & 0o111), member.mtime, writer)
                    written.append(member.name)
                    written_rel.append(rel)
            if stop is not None and stop():
                break
    if links:
        # Judged on the whole tree, by resolution (chains through other links included),
        # then made without going through any link on the way.
        check_links(links, written_rel, origin, dir_rel)
        for rel, target in links.items():
            confine.symlink_beneath(dest, rel, target)
    return written


def check_links(
    links: Mapping[str, str], others: Iterable[str], origin: str, dirs: Iterable[str] = ()
) -> None:
    """Refuse a tree (``links``: name -> target, ``others``: every other member) in which a
    link resolves out of the tree once every link is followed step by step (``a -> .`` with
    ``up -> a/a/../..`` leaves it although neither text does), or a member lies under a
    link (``data -> /victim`` then ``data/evil.txt``: written through the link) or under a
    file (``others``: the files; ``dirs``: the folders)."""
    table = {tuple(p for p in n.split("/") if p not in ("", ".")): t for n, t in links.items()}

    def readlink(parts: tuple[str, ...]) -> str | None:
        return table.get(parts)

    for name in links:
        try:
            confine.resolve(name, readlink, root=origin)
        except confine.Escape as exc:
            raise _refuse(origin, name, f"link out of the tree once resolved: {exc.what}") from None
    others = list(others)
    files = {tuple(p for p in n.split("/") if p not in ("", ".")) for n in others}
    for name in [*others, *dirs, *links]:
        parts = tuple(p for p in name.split("/") if p not in ("", "."))
        for i in range(1, len(parts)):
            if parts[:i] in table:
                raise _refuse(origin, name, f"lies under the link {'/'.join(parts[:i])!r}")
            if parts[:i] in files:
                raise _refuse(origin, name, f"lies under the file {'/'.join(parts[:i])!r}")


def tree_members(
    tar: tarfile.TarFile, origin: str, limits: Limits = Limits()
) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """Every member of a source tree's tar (``git archive``) with its bytes (None for a
    directory or a link), checked as a whole: names, kinds and sizes as :func:`tar_members`
    with in-tree links, and every link resolved (:func:`check_links`)."""
    out: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for member in tar_members(tar, origin, limits, inner_links=True):
        data = None
        if member.isfile():
            src = tar.extractfile(member)
            assert src is not None
            data = src.read()
        out.append((member, data))
    links = {m.name: m.linkname for m, _ in out if m.issym()}
    files = [m.name for m, _ in out if m.isfile()]
    check_links(links, files, origin, [m.name for m, _ in out if m.isdir()])
    return out
