"""Export a replayed tree: a deterministic source tarball, a directory, and the lock JSON."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_dir, atomic_write_bytes, atomic_write_text
from pinwheel.source import gitcli
from pinwheel.source.replay import ReplayResult, lock_payload


def _archive(result: ReplayResult, prefix: str) -> bytes:
    # git archive stamps every member with the commit time: no wall clock inside.
    proc = gitcli.git(
        ["archive", "--format=tar", f"--prefix={prefix}/", "--end-of-options", result.head],
        git_dir=result.repo_path,
        check=False,
    )
    if proc.returncode != 0:
        err = gitcli.stderr_lines(proc)
        raise PinwheelError(
            f"cannot export tree {result.tree[:12]}: {err[-1] if err else proc.returncode}",
            where=f"export of {result.head[:12]}",
            next="export needs every blob: point --mirror at a complete (non-partial) mirror",
        )
    return proc.stdout


def source_name(result: ReplayResult) -> str:
    return result.tag or f"{result.manifest.name}-{result.head[:12]}"


def export_tarball(result: ReplayResult, out_dir: Path) -> tuple[Path, Path]:
    """Write ``<name>.tar.gz`` and ``<name>.lock.json`` into ``out_dir``."""
    name = source_name(result)
    raw = _archive(result, name)
    buf = io.BytesIO()
    # mtime=0 and no filename: the gzip header carries no wall clock either.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    tarball = Path(out_dir) / f"{name}.tar.gz"
    lock = Path(out_dir) / f"{name}.lock.json"
    atomic_write_bytes(tarball, buf.getvalue())
    atomic_write_text(lock, json.dumps(lock_payload(result), indent=2, sort_keys=True) + "\n")
    return tarball, lock


def export_tree(result: ReplayResult, dest: Path) -> Path:
    """Write the replayed tree into directory ``dest`` (replaced atomically)."""
    raw = _archive(result, "src")
    with atomic_dir(Path(dest)) as tmp:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            tar.extractall(tmp, filter="data")
        staged = tmp / "src"
        for child in staged.iterdir():
            child.rename(tmp / child.name)
        staged.rmdir()
    return Path(dest)
