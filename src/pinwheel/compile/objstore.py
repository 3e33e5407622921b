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

Backends (:mod:`pinwheel.compile.objbackends`): the compiler cache's own store. For
``[build.cache] backend = "local"`` the directory ``<SCCACHE_DIR>/pinwheel-objects``
(runners sharing that directory share both; sccache's size cap counts it); for
``"redis"`` and ``"s3"`` the same keys under ``<prefix>/pinwheel-objects/`` in the
server or bucket sccache uses, reached with sccache's settings (``SCCACHE_REDIS_*``,
``SCCACHE_BUCKET``/``_ENDPOINT``/``_REGION``, the standard AWS credentials), so an
ephemeral CI runner with a warm shared cache compiles nothing. GitHub's cache is not
covered: the store is off there and the phase table says so. A remote store nothing
answers at is "no store" (said in the phase table); a transfer cut off later is a miss
or "not stored", never a failed build. The wheel is written before its index record,
so a reader finds no record whose wheel is not whole.

Records and wheels are read as untrusted (a shared store is written by other
machines): bounded reads (the record through :mod:`pinwheel.untrusted`'s bounded JSON,
the wheel up to :data:`MAX_WHEEL`), the wheel name validated, the copy's sha256 checked
before it is used. The store is as trusted as the compiler cache it lives in: whoever
can write sccache's objects can write these.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import confine, untrusted, validate
from pinwheel.checksums import sha256_file
from pinwheel.compile import compcache, derivation, objbackends
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import remove_tree
from pinwheel.options import AwsCredentials

FORMAT = 1
SUBDIR = objbackends.SUBDIR
KIND = untrusted.Kind(
    "object store record", 64 * untrusted.MiB, 64, PinwheelError,
    "nothing to do: the build compiles instead",
)  # fmt: skip
_is_sha = validate.is_sha256


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
    return derivation.digest(dict(ident))


# A default: the largest stored wheel read back (the engine wheels built so far are < 1 GiB).
MAX_WHEEL = 2 * untrusted.GiB


def _index_key(ident: Mapping[str, Any], match_key: str) -> str:
    return f"v{FORMAT}/index/{identity_key(ident)}/{match_key}.json"


def _blob_key(sha256: str) -> str:
    return f"v{FORMAT}/wheels/{sha256}/wheel"


@dataclass(frozen=True)
class Miss:
    """No usable entry, and why (shown in the phase table)."""

    why: str


@dataclass(frozen=True)
class Store:
    """The store over one backend (:mod:`pinwheel.compile.objbackends`): a local directory
    beside sccache's, or the Redis or S3 store the compiler cache uses."""

    backend: objbackends.Backend

    def put(
        self, wheel: Path, record: Mapping[str, Any], match: Mapping[str, Any]
    ) -> tuple[bool, str]:
        """Store ``wheel`` and its compiled-inputs ``record``; ``match``: what else must
        be equal for a hit (version, date: what reaches the wheel's metadata). (stored,
        the line for the phase table): not stored when the record is not reusable
        (incomplete) or the backend failed; never raises for a backend's failure. The
        wheel goes first, the index record after: a reader never finds a record whose
        wheel was not written whole."""
        if not record.get("compiled_members"):
            return False, "not stored in the object store: no compiled member"
        sha = sha256_file(wheel)
        entry = {
            "format": FORMAT,
            "wheel": Path(wheel).name,
            "sha256": sha,
            "match": dict(match),
            "record": dict(record),
        }
        key = identity_key(json.loads(json.dumps(dict(match), sort_keys=True)))
        try:
            self.backend.send(_blob_key(sha), Path(wheel), sha)
            self.backend.write(
                _index_key(record["identity"], key), json.dumps(entry, sort_keys=True).encode()
            )
        except objbackends.Unavailable as exc:
            return False, f"not stored in the object store: {_said(exc)}"
        return True, "stored in the object store"

    def lookup(self, ident: Mapping[str, Any], match: Mapping[str, Any]) -> Hit | Miss:
        """The stored build of this identity whose ``match`` facts (the export's digest,
        version, date, the caller's flags) are equal, checked; a :class:`Miss` saying why
        not (no entry, an unusable record, the backend unreachable)."""
        want = json.loads(json.dumps(dict(match), sort_keys=True))
        key = _index_key(ident, identity_key(want))
        try:
            data = self.backend.read(key, KIND.max_bytes)
        except objbackends.Unavailable as exc:
            return Miss(f"miss: {_said(exc)}")
        if data is None:
            return Miss("miss")
        try:
            raw = untrusted.parse_json(data, KIND, key)
        except PinwheelError as exc:
            return Miss(f"miss: an unusable record ({exc.what[:200]})")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            return Miss("miss: a record of another format")
        rec, sha, name = raw.get("record"), raw.get("sha256"), raw.get("wheel")
        if raw.get("match") != want or not isinstance(rec, dict) or not _is_sha(sha):
            return Miss("miss: a record that does not match")
        if rec.get("identity") != json.loads(json.dumps(dict(ident))):
            return Miss("miss: a record of another identity")
        if not isinstance(name, str) or validate.wheel_name_problem(name):
            return Miss("miss: a record naming no valid wheel")
        return Hit(_blob_key(str(sha)), name, str(sha), rec)

    def take(self, hit: Hit, dist: Path) -> Path | Miss:
        """The stored wheel copied into ``dist`` under its name (at most
        :data:`MAX_WHEEL` bytes), its sha256 checked on the copy: a wheel missing, cut
        off or changed since it was written is a :class:`Miss` and nothing is left."""
        remove_tree(dist, ignore_errors=True)
        dist.mkdir(parents=True)
        target = confine.inside(dist, hit.name, what="wheel")
        why = None
        try:
            with open(target, "xb") as out:
                if not self.backend.fetch(hit.blob, out, MAX_WHEEL):
                    why = "miss: the record's wheel is not in the store"
        except objbackends.Unavailable as exc:
            why = f"miss: {_said(exc)}"
        if why is None and sha256_file(target) != hit.sha256:
            why = "entry changed, a miss (the stored wheel's sha256 is not the record's)"
        if why is not None:
            target.unlink(missing_ok=True)
            return Miss(why)
        return target


def _said(exc: PinwheelError) -> str:
    return f"{exc.where}: {exc.what}" if exc.where else exc.what


@dataclass(frozen=True)
class Hit:
    blob: str  # the wheel's key in the store
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
    plan: compcache.Plan,
    *,
    cold: bool,
    turned_off: bool = False,
    aws: AwsCredentials | None = None,
) -> tuple[Store | None, str]:
    """The store of the compiler cache's backend, or (None, why not). ``turned_off``:
    ``[build.cache] enabled = false``. Without an sccache binary the store still works.
    ``aws``: what an S3 store signs with (:class:`pinwheel.options.AwsCredentials`).
    A remote store is reached once here (Redis ``PING``, an S3 ``GET``): unreachable
    means no store."""
    if cold:
        return None, "a cold build (--no-cache, verify-build) reuses nothing"
    if turned_off:
        return None, "turned off ([build.cache] enabled = false)"
    if plan.disabled and plan.binary is not None:
        return None, f"the compiler cache is off ({plan.disabled})"
    make = objbackends.BACKENDS.get(plan.backend)
    if make is None:
        known = ", ".join(objbackends.BACKENDS)
        return None, f"the {plan.backend} backend has no object store ({known})"
    try:
        backend = make(plan.server_env, aws or AwsCredentials())
    except ValueError as exc:
        return None, f"the {plan.backend} settings cannot be read: {exc}"
    try:
        backend.check()
    except objbackends.Unavailable as exc:
        return None, f"the {plan.backend} store is unreachable: {_said(exc)}"
    return Store(backend), backend.describe()


__all__ = ["MAX_WHEEL", "Hit", "Miss", "Store", "caller_flags", "for_plan", "identity_key"]
