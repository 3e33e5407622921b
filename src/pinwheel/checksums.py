"""SHA256SUMS files (``sha256sum -c`` format) and parallel hashing of large files.

Hashing ~100 GiB of model or wheels is I/O plus one core per file; hashlib
(OpenSSL, SHA-NI where the CPU has it) releases the GIL on large updates, so
threads give real parallelism. One file cannot be split (SHA-256 is a chain),
so many files are spread over the cores, largest first, so the last file to
finish is a small one.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pinwheel.errors import VerifyError
from pinwheel.fsutil import atomic_write_text
from pinwheel.validate import SHA256_HEX_ANY_CASE, member_problem

# 8 MiB reads: few syscalls, and each update hands OpenSSL a block big enough
# that the GIL stays released for most of the time.
CHUNK = 8 * 1024 * 1024
# As `sha256sum -c` reads it: hex in either case, then " " and " " (text) or "*" (binary).
_LINE = re.compile(f"({SHA256_HEX_ANY_CASE}) [ *](.+)")

# Called with a byte count after every read, from the hashing threads (progress.Advance).
Advance = Callable[[int], None]


SUMS = "SHA256SUMS"
SIG = "SHA256SUMS.sig"


def sha256_file(path: Path, chunk: int = CHUNK, on_bytes: Advance | None = None) -> str:
    digest = hashlib.sha256()
    feed(digest, path, chunk, on_bytes)
    return digest.hexdigest()


def feed(digest: Any, path: Path, chunk: int = CHUNK, on_bytes: Advance | None = None) -> None:
    """Hash ``path``'s bytes into ``digest`` (a hashlib object): the one file-reading loop."""
    with open(path, "rb", buffering=0) as fh:
        if hasattr(os, "posix_fadvise"):
            # Tell the kernel we read front to back: it reads ahead further.
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(chunk)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)


def default_workers(count: int) -> int:
    return max(1, min(count, os.cpu_count() or 1))


def sha256_files(
    paths: Iterable[Path], workers: int | None = None, on_bytes: Advance | None = None
) -> dict[Path, str]:
    """Hash many files in parallel; returns {path: hexdigest} in input order."""
    paths = list(paths)
    if not paths:
        return {}
    workers = workers or default_workers(len(paths))
    if workers == 1 or len(paths) == 1:
        return {p: sha256_file(p, on_bytes=on_bytes) for p in paths}
    # Largest first: with one big file last, one core would idle while the other finishes it.
    order = sorted(paths, key=lambda p: -_size(p))
    from concurrent.futures import ThreadPoolExecutor  # a thread pool only when hashing many

    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = dict(
            zip(order, pool.map(lambda p: sha256_file(p, on_bytes=on_bytes), order), strict=True)
        )
    return {p: done[p] for p in paths}


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # let the hashing raise the real error, with the path in it


def format_sums(digests: Mapping[str, str]) -> str:
    return "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))


def write_sums(directory: Path, names: Iterable[str], filename: str = SUMS) -> Path:
    """Write ``filename`` in ``directory`` listing ``names`` (relative to it)."""
    directory = Path(directory)
    names = sorted(names)
    hashed = sha256_files([directory / n for n in names])
    digests = {n: hashed[directory / n] for n in names}
    target = directory / filename
    atomic_write_text(target, format_sums(digests))
    return target


def parse_sums(text: str | bytes, source: str = SUMS, *, flat: bool = True) -> dict[str, str]:
    """{name: sha256 (lower-case)} from ``sha256sum`` output, read as ``sha256sum -c`` reads it.

    Refused: a malformed line, no entries at all, a name listed twice, a name that is
    absolute, has a ``..`` component or control characters, and (``flat``, the default
    for releases) any name with a directory part: nothing may land outside the folder.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise VerifyError(
                f"not UTF-8 text (byte {exc.start})",
                where=source,
                next="regenerate it with `pinwheel release` or `sha256sum FILES > SHA256SUMS`",
            ) from None
    sums: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if not m:
            raise VerifyError(
                f"malformed line {line[:80]!r}",
                where=f"{source}:{n}",
                next="regenerate it with `pinwheel release` or `sha256sum FILES > SHA256SUMS`",
            )
        digest, name = m.group(1).lower(), m.group(2)
        reason = _unsafe_name(name, flat)
        if reason:
            raise VerifyError(
                f"unsafe file name {name[:120]!r}: {reason}; nothing was written",
                where=f"{source}:{n}",
                next="do not use this release; ask the publisher for a SHA256SUMS of plain "
                "file names",
            )
        if name in sums:
            raise VerifyError(
                f"{name!r} is listed twice"
                + (" with different hashes" if sums[name] != digest else ""),
                where=f"{source}:{n}",
                next="do not use this release; ask the publisher to regenerate SHA256SUMS",
            )
        sums[name] = digest
    if not sums:
        raise VerifyError(
            "lists no files",
            where=source,
            next="the release is incomplete: ask the publisher to regenerate SHA256SUMS",
        )
    return sums


def _unsafe_name(name: str, flat: bool) -> str | None:
    problem = member_problem(name)
    if problem:
        return problem
    parts = name.replace("\\", "/").split("/")
    if flat and len(parts) > 1:
        return "has a directory part (a release is one flat folder)"
    if name in (".", "") or parts[-1] in (".", ""):
        return "not a file name"
    return None


def verify_dir(directory: Path, sums: Mapping[str, str]) -> None:
    """Check every listed file in ``directory``; raise naming each file that differs."""
    directory = Path(directory)
    missing = [n for n in sums if not (directory / n).is_file()]
    if missing:
        raise VerifyError(
            f"listed in SHA256SUMS but missing: {', '.join(sorted(missing))}", where=str(directory)
        )
    actual = sha256_files([directory / n for n in sums])
    bad = [n for n in sums if actual[directory / n] != sums[n]]
    if bad:
        raise VerifyError(
            "sha256 mismatch: " + ", ".join(sorted(bad)),
            where=str(directory),
            next="re-download the release (`pinwheel fetch`) or rebuild it",
        )
