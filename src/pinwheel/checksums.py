"""SHA256SUMS files (``sha256sum -c`` format) and parallel hashing of large files.

Hashing ~100 GiB of model or wheels is I/O plus one core per file; hashlib
releases the GIL on large updates, so threads give real parallelism.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import VerifyError
from .fsutil import atomic_write_text

CHUNK = 4 * 1024 * 1024
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def sha256_file(path: Path, chunk: int = CHUNK) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def sha256_files(paths: Iterable[Path], workers: int | None = None) -> dict[Path, str]:
    """Hash many files in parallel; returns {path: hexdigest} in input order."""
    paths = list(paths)
    workers = workers or min(len(paths), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(paths, pool.map(sha256_file, paths), strict=True))


def format_sums(digests: Mapping[str, str]) -> str:
    return "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))


def write_sums(directory: Path, names: Iterable[str], filename: str = "SHA256SUMS") -> Path:
    """Write ``filename`` in ``directory`` listing ``names`` (relative to it)."""
    directory = Path(directory)
    names = sorted(names)
    hashed = sha256_files([directory / n for n in names])
    digests = {n: hashed[directory / n] for n in names}
    target = directory / filename
    atomic_write_text(target, format_sums(digests))
    return target


def parse_sums(text: str, source: str = "SHA256SUMS") -> dict[str, str]:
    """{name: sha256} from ``sha256sum`` output; rejects malformed lines and unsafe names."""
    sums: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise VerifyError(
                f"malformed line {line[:80]!r}",
                where=f"{source}:{n}",
                next="regenerate it with `pinwheel release` or `sha256sum FILES > SHA256SUMS`",
            )
        digest, name = m.group(1), m.group(2)
        if name.startswith("/") or ".." in Path(name).parts:
            raise VerifyError(f"unsafe file name {name!r}", where=f"{source}:{n}")
        sums[name] = digest
    return sums


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
