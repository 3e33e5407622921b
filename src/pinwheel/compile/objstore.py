"""Compiled objects shared through the compiler cache's store: a hit compiles nothing.

sccache's hit still preprocesses every translation unit (nvcc's host and device
passes), and configure, link and packaging run in full: on the real engine, a fresh
workspace with a warm shared cache spent 571 s in the builder with 0 misses. This
store is pinwheel's own reuse one level up, keyed by what :mod:`pinwheel.compile.reuse`
already records for every wheel (``compiled_inputs``: the source files the compilers
read, taken from their own dependency output, with their git blob ids; the build
files; and the identity of what compiles: nvcc and host compiler, Python, builder,
the environment pinwheel set, the build sources' digests):

- after a build: the wheel is put in the store under the identity's key, with its
  compiled-inputs record;
- before a build whose workspace has nothing to hand back: every record under the
  same identity is compared with the new tree (each recorded path's blob id, no
  build file added). A record that holds is a hit: its wheel is verified (sha256,
  every compiled member against the record) and its compiled members are
  transplanted into a wheel of the new tree (:func:`pinwheel.compile.reuse.transplant`):
  no preprocessor, no configure, no compile, no link. The bytes are the ones a cold
  build of that tree gives (``tests/test_objstore.py`` compares them).

A partial change (one compiled input differs) is a miss here and the build runs
with the compiler cache as before: reuse is per wheel, not per object file.

Backend: the local directory of ``[build.cache] backend = "local"`` (``SCCACHE_DIR``:
the store lives in ``<SCCACHE_DIR>/pinwheel-objects``, so a runner that shares that
directory shares both; sccache's size cap counts it). Redis, S3 and GitHub's cache are
not covered: the store is off there and the phase table says so. Every record is read
as untrusted (a shared store is written by other machines): bounded JSON, paths
checked by :func:`pinwheel.compile.reuse.unchanged`, the wheel's sha256 and its
members checked before a byte of it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import confine, untrusted
from pinwheel.checksums import sha256_file
from pinwheel.compile import compcache, reuse
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_text

FORMAT = 1
SUBDIR = "pinwheel-objects"
MAX_RECORDS = 16  # records compared per identity, newest first: a default
KIND = untrusted.Kind(
    "object store record", 64 * untrusted.MiB, 64, PinwheelError,
    "nothing to do: the build compiles instead",
)  # fmt: skip
_HEX64 = frozenset("0123456789abcdef")


def _is_sha(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX64


# Search paths hold machine paths (the cache, a venv): they stay out of a match, which
# must hold on another runner; what they find is in the identity (compilers, torch).
_PATHS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "CPATH", "LIBRARY_PATH",
          "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")  # fmt: skip


def caller_flags(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's compiler settings (CFLAGS, CC, NVCC_APPEND_FLAGS...): they reach the
    compilers but pinwheel does not set them, so the identity does not hold them."""
    from pinwheel.compile.workspace import COMPILER_ENV

    return {k: environ[k] for k in COMPILER_ENV if k in environ and k not in _PATHS}


def identity_key(ident: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(ident), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Store:
    """A local-directory store (one per cache backend directory)."""

    root: Path

    def _index(self, ident: Mapping[str, Any]) -> Path:
        return self.root / f"v{FORMAT}" / "index" / identity_key(ident)

    def _blob(self, sha256: str) -> Path:
        return self.root / f"v{FORMAT}" / "wheels" / sha256 / "wheel"

    def put(self, wheel: Path, record: Mapping[str, Any], match: Mapping[str, Any]) -> bool:
        """Store ``wheel`` and its compiled-inputs ``record``; ``match``: what else must
        be equal for a hit (version, date: what reaches the wheel's metadata). False
        when the record is not reusable (incomplete) and nothing was stored."""
        if not record.get("complete") or not record.get("compiled_members"):
            return False
        sha = sha256_file(wheel)
        blob = self._blob(sha)
        if not (blob.is_file() and not blob.is_symlink() and sha256_file(blob) == sha):
            confine.mkdirs(self.root, blob.parent)
            tmp = blob.with_name(f".wheel.{os.getpid()}.tmp")
            shutil.copyfile(wheel, tmp)
            os.replace(tmp, blob)
        entry = {
            "format": FORMAT,
            "wheel": Path(wheel).name,
            "sha256": sha,
            "match": dict(match),
            "record": dict(record),
        }
        index = self._index(record["identity"])
        confine.mkdirs(self.root, index)
        atomic_write_text(index / f"{record['digest']}.json", json.dumps(entry, sort_keys=True))
        return True

    def lookup(
        self, ident: Mapping[str, Any], source: Path, match: Mapping[str, Any]
    ) -> tuple[reuse.Candidate | None, str]:
        """(a verified earlier wheel whose compiled inputs all hold in ``source`` and
        whose ``match`` facts are equal, why); (None, why) on a miss."""
        index = self._index(ident)
        try:
            entries = sorted(
                (p for p in index.iterdir() if p.name.endswith(".json")),
                key=lambda p: p.lstat().st_mtime_ns,
                reverse=True,
            )[:MAX_RECORDS]
        except OSError:
            return None, "no record for this toolchain and environment"
        last_why = "no record for this toolchain and environment"
        for path in entries:
            try:
                raw = untrusted.read_json(path, KIND)
            except PinwheelError:
                continue
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                continue
            if raw.get("match") != json.loads(json.dumps(dict(match))):
                last_why = "an earlier build of other version or date"
                continue
            rec, sha, name = raw.get("record"), raw.get("sha256"), raw.get("wheel")
            if not isinstance(rec, dict) or not _is_sha(sha) or not isinstance(name, str):
                continue
            blob = self._blob(str(sha))
            candidate = reuse.Candidate(
                wheel=blob, sha256=str(sha), origin="the object store",
                component={"compiled_inputs": rec, "wheel": name, "sha256": sha},
            )  # fmt: skip
            try:
                ok, why, _ = reuse.unchanged(candidate, source, ident)
            except PinwheelError as err:  # a record naming paths outside the tree
                last_why = err.what
                continue
            if not ok:
                last_why = why
                continue
            if not blob.is_file() or blob.is_symlink() or sha256_file(blob) != sha:
                last_why = "the stored wheel is missing or does not match its sha256"
                continue
            return candidate, why
        return None, last_why


def for_plan(plan: compcache.Plan, *, cold: bool) -> tuple[Store | None, str]:
    """The store of the compiler cache's backend, or (None, why not)."""
    if cold:
        return None, "a cold build (--no-cache, verify-build) reuses nothing"
    if plan.disabled and plan.binary is not None:
        return None, f"the compiler cache is off ({plan.disabled})"
    if plan.backend != "local":
        return None, f"the {plan.backend} backend has no object store (local directories only)"
    directory = plan.server_env.get("SCCACHE_DIR")
    if not directory:
        return None, "no local cache directory"
    return Store(Path(directory) / SUBDIR), f"local ({SUBDIR} in the compiler cache's directory)"


__all__ = ["Store", "caller_flags", "for_plan", "identity_key"]
