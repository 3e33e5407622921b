"""The cache's layout, owned in one place: every top-level folder, who writes it, what it
holds and what ``pinwheel cache clean`` / ``prune`` may do with it.

Every module that writes under the cache takes its folder from :func:`bucket` (an unknown
name is a programming error, not a new folder), and ``pinwheel cache du/clean/prune`` read
:data:`BUCKETS` instead of keeping lists of their own. A folder the table does not name is
shown by ``cache du`` as "not pinwheel's" and left alone by ``prune``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bucket:
    """One top-level entry of the cache."""

    name: str  # the folder (or file) under the cache root
    owner: str  # the module that writes it
    holds: str  # what is in it, for `cache du`
    clean: bool  # `cache clean --yes` removes it (False: another run may hold it)
    rebuildable: bool  # removing it costs time, never correctness (everything is re-made)


BUCKETS: tuple[Bucket, ...] = (
    Bucket("repos", "source.cache", "one bare repository per upstream URL, replay stamps",
           clean=True, rebuildable=True),
    Bucket("locks", "locking", "the lock files of repositories, workspaces and venvs",
           clean=False, rebuildable=True),
    Bucket("CACHEDIR.TAG", "source.cache", "the marker: this folder is pinwheel's cache",
           clean=False, rebuildable=True),
    Bucket("toolchains", "compile.toolchain.provision", "provisioned CUDA toolkits",
           clean=True, rebuildable=True),
    Bucket("venvs", "compile.buildvenv", "build and tool venvs, one per hashed lock",
           clean=True, rebuildable=True),
    Bucket("headers", "compile.headerview", "views of header folders pinwheel did not install",
           clean=True, rebuildable=True),
    Bucket("hooks", "compile.listing", "the sorted-listing sitecustomize every build loads",
           clean=True, rebuildable=True),
    Bucket("sccache", "compile.compcache", "the compiler cache's local objects",
           clean=True, rebuildable=True),
    Bucket("sccache-run", "compile.pipeline", "the per-build compiler-cache server's state",
           clean=True, rebuildable=True),
    Bucket("build", "compile.pipeline", "the engine's kept workspace per manifest",
           clean=True, rebuildable=True),
    Bucket("kernels", "compile.kernels", "each [[kernel]]'s kept workspace",
           clean=True, rebuildable=True),
    Bucket("memo", "compile.checkmemo", "check, tag and toolkit-probe results by sha256, "
           "venv checks' signed stat memos",
           clean=True, rebuildable=True),
    Bucket("keys", "keyfile", "the keys object store entries, replay stamps and venv memos "
           "are signed with (0600; a new key: earlier entries and stamps stop matching)",
           clean=False, rebuildable=True),
)  # fmt: skip

_BY_NAME = {b.name: b for b in BUCKETS}


def known(name: str) -> Bucket | None:
    """The bucket named ``name`` (None: not pinwheel's)."""
    return _BY_NAME.get(name)


def bucket(root: Path, name: str) -> Path:
    """``root/name`` for a bucket the table names; any other name is a programming error."""
    if name not in _BY_NAME:
        raise KeyError(f"{name!r} is not a cache bucket (pinwheel.cachelayout.BUCKETS)")
    return Path(root) / name


def kept_by_clean() -> tuple[str, ...]:
    """The entries `cache clean` never removes."""
    return tuple(b.name for b in BUCKETS if not b.clean)


__all__ = ["BUCKETS", "Bucket", "bucket", "kept_by_clean", "known"]
