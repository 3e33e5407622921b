"""Copy a pin's files out of a .deb (streamed) or a wheel into a toolkit tree; ``advance``
(a :data:`pinwheel.progress.Advance`) gets the bytes of the package read so far."""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from pinwheel import archive
from pinwheel.compile.toolchain.pins import DebPin, WheelPin
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.progress import Advance


def _ar_member(path: Path, prefix: str) -> tuple[int, int]:
    """(offset, size) of the first member named ``prefix*`` in an ``ar`` archive (a .deb)."""
    with open(path, "rb") as fh:
        if fh.read(8) != b"!<arch>\n":
            raise ToolchainError(f"{path.name} is not a Debian package (no ar header)")
        while header := fh.read(60):
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            if name.startswith(prefix):
                return fh.tell(), size
            fh.seek(size + (size % 2), io.SEEK_CUR)
    raise ToolchainError(f"{path.name} has no {prefix}* member", where=str(path))


class _Window(io.RawIOBase):
    """A read-only view of ``size`` bytes of a file from ``offset``: one ar member."""

    def __init__(
        self, fh: io.BufferedReader, offset: int, size: int, advance: Advance | None = None
    ):
        fh.seek(offset)
        self._fh, self._left, self._advance = fh, size, advance

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self._fh.readinto(memoryview(buf)[: min(len(buf), self._left)])
        self._left -= n
        if self._advance is not None and n:
            self._advance(n)
        return n


def unpack_deb(path: Path, pin: DebPin, dest: Path, advance: Advance | None = None) -> None:
    """Copy the pinned files out of the data.tar, streaming: nvidia-cuda-dev is 900 MB.
    ``advance`` gets each chunk of the (compressed) data.tar as it is read."""
    offset, size = _ar_member(path, "data.tar")
    wanted = dict(pin.files)
    seen: set[str] = set()  # pinned files (not dirs) copied so far
    with open(path, "rb") as fh:
        stream = io.BufferedReader(_Window(fh, offset, size, advance), 1 << 20)
        with tarfile.open(fileobj=stream, mode="r|*") as tar:

            def select(rel: str, is_dir: bool) -> str | None:
                target = _map(rel, wanted)
                if target is not None and not is_dir and rel in wanted:
                    seen.add(rel)
                return target

            # The one archive reader: names, links, devices and sizes checked, writes confined.
            archive.extract_tar(
                tar,
                dest,
                path.name,
                select=select,
                stop=lambda: len(seen) == len(wanted),
                skip_links=True,
            )
    _require(dest, pin.files, path.name)


def _map(rel: str, wanted: Mapping[str, str]) -> str | None:
    """Where ``rel`` goes in the tree, if a pinned file or directory covers it."""
    if rel in wanted:
        return wanted[rel]
    for src, dst in wanted.items():
        if rel.startswith(src + "/"):
            return dst + rel[len(src) :]
    return None


def _require(dest: Path, files: tuple[tuple[str, str], ...], origin: str) -> None:
    missing = [dst for _, dst in files if not (dest / dst).exists()]
    if missing:
        raise ToolchainError(
            f"{origin} lacks {', '.join(missing)}",
            where=origin,
            next="the package layout changed: update LOCKS in pinwheel/compile/toolchain/pins.py",
        )


def unpack_wheel(path: Path, pin: WheelPin, dest: Path, advance: Advance | None = None) -> None:
    """The pinned files out of a wheel; ``advance`` gets the wheel's size once they are out."""
    wanted = dict(pin.files)
    with zipfile.ZipFile(path) as zf:
        archive.extract_zip(zf, dest, path.name, select=lambda n, _d: _map(n.rstrip("/"), wanted))
    _require(dest, pin.files, path.name)
    if advance is not None:
        advance(path.stat().st_size)
