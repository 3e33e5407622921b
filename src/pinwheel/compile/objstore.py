"""Builds shared through the compiler cache's store: a fresh workspace compiles nothing.

sccache's hit still preprocesses every translation unit (nvcc's host and device
passes), and configure, link and packaging run in full: on the real engine, a fresh
workspace with a warm shared cache spent 571 s in the builder with 0 misses. This
store is pinwheel's own reuse one level up. After a build, its wheel is stored with
the compiled-inputs record :mod:`pinwheel.compile.reuse` writes for every wheel, under

- the identity of what compiles (``reuse.identity``: nvcc and host compiler, Python,
  builder, the environment pinwheel set, torch, the build sources' digests), and
- the *match* facts: the exported tree's digest (every file's name, mode and bytes),
  the version and date that reach the wheel's metadata, and the caller's compiler
  settings (:func:`caller_flags`).

A build whose workspace has nothing to hand back looks both up: a hit is the stored
wheel, copied into the workspace and its sha256 checked: nothing is preprocessed,
configured, compiled or linked, and the bytes are the stored cold build's.

Only the same tree hits. Transplanting stored members into a wheel of a changed tree
(what ``--reuse-from`` does) is not used here: for the scikit-build-core selftest
kernel the repacked wheel's sha256 differed from a cold build's (bench/objstore_build.py
first version), and a fast path must give the cold bytes. A changed tree builds with
the compiler cache as before.

Backend: the local directory of ``[build.cache] backend = "local"`` (``SCCACHE_DIR``:
the store lives in ``<SCCACHE_DIR>/pinwheel-objects``, so runners that share that
directory share both; sccache's size cap counts it). Redis, S3 and GitHub's cache are
not covered: the store is off there and the phase table says so. Records are read as
untrusted (a shared directory is written by other machines): bounded JSON, the wheel
name validated, the copy's sha256 checked before it is used. The store is as trusted
as the compiler cache it lives in: whoever can write sccache's objects can write these.
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

from pinwheel import confine, untrusted, validate
from pinwheel.checksums import sha256_file
from pinwheel.compile import compcache
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_text, remove_tree

FORMAT = 1
SUBDIR = "pinwheel-objects"
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
        if not record.get("compiled_members"):
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
        key = identity_key(json.loads(json.dumps(dict(match), sort_keys=True)))
        atomic_write_text(index / f"{key}.json", json.dumps(entry, sort_keys=True))
        return True

    def lookup(self, ident: Mapping[str, Any], match: Mapping[str, Any]) -> Hit | None:
        """The stored build of this identity whose ``match`` facts (the export's digest,
        version, date, the caller's flags) are equal, verified; None on a miss."""
        want = json.loads(json.dumps(dict(match), sort_keys=True))
        path = self._index(ident) / f"{identity_key(want)}.json"
        try:
            raw = untrusted.read_json(path, KIND)
        except PinwheelError:
            return None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            return None
        rec, sha, name = raw.get("record"), raw.get("sha256"), raw.get("wheel")
        if raw.get("match") != want or not isinstance(rec, dict) or not _is_sha(sha):
            return None
        if rec.get("identity") != json.loads(json.dumps(dict(ident))):
            return None
        if not isinstance(name, str) or validate.wheel_name_problem(name):
            return None
        blob = self._blob(str(sha))
        if not blob.is_file() or blob.is_symlink():
            return None
        return Hit(blob, name, str(sha), rec)

    def take(self, hit: Hit, dist: Path) -> Path | None:
        """The stored wheel copied into ``dist`` under its name, its sha256 checked on the
        copy (a store entry changed since it was written is a miss); None then."""
        remove_tree(dist, ignore_errors=True)
        dist.mkdir(parents=True)
        target = confine.inside(dist, hit.name, what="wheel")
        shutil.copyfile(hit.blob, target)
        if sha256_file(target) != hit.sha256:
            target.unlink()
            return None
        return target


@dataclass(frozen=True)
class Hit:
    blob: Path
    name: str  # the wheel's file name as built
    sha256: str
    record: Mapping[str, Any]  # its compiled inputs

    def reused(self) -> dict[str, Any]:
        """The reuse record provenance carries (as for ``--reuse-from``)."""
        return {
            "from": "the object store",
            "wheel": self.name,
            "wheel_sha256": self.sha256,
            "tree": self.record.get("tree"),
            "why": "the same exported tree, toolchain, flags and environment",
            "members": dict(self.record.get("compiled_members") or {}),
        }


def for_plan(
    plan: compcache.Plan, *, cold: bool, turned_off: bool = False
) -> tuple[Store | None, str]:
    """The store of the compiler cache's backend, or (None, why not). ``turned_off``:
    ``[build.cache] enabled = false``. Without an sccache binary the store still works."""
    if cold:
        return None, "a cold build (--no-cache, verify-build) reuses nothing"
    if turned_off:
        return None, "turned off ([build.cache] enabled = false)"
    if plan.disabled and plan.binary is not None:
        return None, f"the compiler cache is off ({plan.disabled})"
    if plan.backend != "local":
        return None, f"the {plan.backend} backend has no object store (local directories only)"
    directory = plan.server_env.get("SCCACHE_DIR")
    if not directory:
        return None, "no local cache directory"
    return Store(Path(directory) / SUBDIR), f"local ({SUBDIR} in the compiler cache's directory)"


__all__ = ["Hit", "Store", "caller_flags", "for_plan", "identity_key"]
