"""Atomic writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Build a directory under a temp name beside ``final``; rename it into place on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        swap_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def swap_dir(new: Path, final: Path) -> None:
    """Put directory ``new`` at ``final``, replacing what is there.

    Two renames: ``final`` -> ``.final.old``, ``new`` -> ``final``. A crash
    between them leaves ``.final.old`` beside a missing ``final``;
    :func:`recover_dir` puts it back.
    """
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, final)


def recover_dir(final: Path) -> None:
    """Undo a :func:`swap_dir` that was interrupted between its two renames."""
    old = final.with_name(f".{final.name}.old")
    if not final.exists() and old.is_dir():
        os.replace(old, final)
    shutil.rmtree(old, ignore_errors=True)


def free_space(path: Path) -> str:
    """Free space on the file system holding ``path`` (its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = float(shutil.disk_usage(probe).free)
    except OSError:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"  # pragma: no cover


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (multi-GiB wheels: no second copy on the same
    filesystem), a copy where linking is not possible; a directory is copied whole."""
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
