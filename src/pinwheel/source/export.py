"""Export a replayed tree: a deterministic source tarball, a directory, and the lock JSON."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

from pinwheel import archive
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_dir, atomic_write_bytes, atomic_write_text
from pinwheel.source import gitcli, stamp
from pinwheel.source.libgit2 import pygit2
from pinwheel.source.replay import lock_payload
from pinwheel.source.result import ReplayResult


def missing_paths(repo_path: Path, commit: str) -> list[str]:
    """Files of ``commit``'s tree whose content the cache (and its mirrors) lack, sorted."""
    repo = pygit2.Repository(str(repo_path))
    missing: list[str] = []

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            path = f"{prefix}{entry.name}"
            if entry.type_str == "tree":
                if entry.id in repo:
                    walk(repo[entry.id].peel(pygit2.Tree), path + "/")
                else:
                    missing.append(path + "/")
            elif entry.type_str == "blob" and entry.id not in repo:
                missing.append(path)

    walk(repo[commit].peel(pygit2.Tree), "")
    return sorted(missing)


def partial_mirror_error(repo_path: Path, commit: str, what: str, where: str) -> PinwheelError:
    """Name the files a partial mirror lacks and how to get them."""
    paths = missing_paths(repo_path, commit)
    shown = "\n".join(f"    {p}" for p in paths[:20])
    more = f"\n    ... and {len(paths) - 20} more" if len(paths) > 20 else ""
    return PinwheelError(
        f"{what}: {len(paths)} file(s) of {commit[:12]} are missing from the partial mirror:"
        f"\n{shown}{more}",
        where=where,
        next="fetch the missing blobs into the mirror (git -C MIRROR fetch --refetch origin, or "
        "clone it without --filter) or point --mirror at a complete mirror; "
        "`pinwheel run` itself does not need them",
    )


# Where the cache repository's info/attributes is made neutral (an input of every replay,
# so it lives with the stamps): re-exported for the export's callers.
NEUTRAL_ATTRIBUTES = stamp.NEUTRAL_ATTRIBUTES
neutral_attributes = stamp.neutral_attributes


def _archive(result: ReplayResult, prefix: str, exclude: Sequence[str] = ()) -> bytes:
    # git archive stamps every member with the commit time: no wall clock inside.
    # No "--" here: after --end-of-options git 2.39 would read it as a pathspec.
    neutral_attributes(result.repo_path)
    specs = [".", *(f":(exclude){e}" for e in exclude)] if exclude else []
    proc = gitcli.git(
        ["archive", "--format=tar", f"--prefix={prefix}/", "--end-of-options", result.head, *specs],
        git_dir=result.repo_path,
        check=False,
    )
    if proc.returncode != 0:
        if missing_paths(result.repo_path, result.head):
            raise partial_mirror_error(
                result.repo_path,
                result.head,
                f"cannot export tree {result.tree[:12]}",
                f"export of {result.head[:12]}",
            )
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


def tree_archive(result: ReplayResult, exclude: Sequence[str] = ()) -> bytes:
    """The replayed tree as an uncompressed tar, every member under ``src/``."""
    return _archive(result, "src", exclude)


def export_tree(result: ReplayResult, dest: Path, exclude: Sequence[str] = ()) -> Path:
    """Write the replayed tree into directory ``dest`` (replaced atomically), leaving out
    the ``exclude`` pathspecs (``[build] exclude``: paths the build does not need)."""
    raw = _archive(result, "src", exclude)
    with atomic_dir(Path(dest)) as tmp:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            # The one archive reader: in-tree symlinks kept, anything leading out refused.
            archive.extract_tar(tar, tmp, "the replayed tree", inner_links=True)
        staged = tmp / "src"
        for child in staged.iterdir():
            child.rename(tmp / child.name)
        staged.rmdir()
    return Path(dest)
