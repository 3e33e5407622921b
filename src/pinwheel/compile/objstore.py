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

A hit is an untrusted answer (a shared store is written by other machines, and a hit
yields the published artifact, not an object file): every entry is signed (HMAC-SHA256,
:mod:`pinwheel.keyfile`) over its index key and its whole text with the key this runner
holds (``PINWHEEL_STORE_KEY``, which runners sharing a store share, else a key made once
in pinwheel's cache: then only this cache's builds hit), and an entry the key did not
sign is a miss. Then everything is checked as if it were not signed: the record read
bounded (:mod:`pinwheel.untrusted`'s JSON), every fact provenance takes from it typed
(the tree a git id and the one this build exports, member names plain relative names,
digests hex, no control character in any text), the wheel copied up to
:data:`MAX_WHEEL` and its sha256 checked, and the copy's own METADATA and WHEEL held to
its file name and to what this build makes: the version the build stamps, the project
name its ``pyproject.toml`` declares (when it declares one), tags this Python and this
machine's architecture install. docs/SECURITY.md says what a hit proves.
"""

from __future__ import annotations

import hmac
import json
import platform
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, canonicalize_version

from pinwheel import confine, keyfile, options, untrusted, validate
from pinwheel.checksums import sha256_file
from pinwheel.compile import compcache, derivation, objbackends
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import remove_tree
from pinwheel.options import AwsCredentials
from pinwheel.wheels import metadata

FORMAT = 2  # 2: entries are signed (1 was not: such an entry is "another format", a miss)
KEY_NAME = "object-store"  # <cache>/keys/object-store.key
_PURPOSE = "pinwheel object store entry"
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

    return {k: v for k, v in options.select(environ, COMPILER_ENV).items() if k not in _PATHS}


def identity_key(ident: Mapping[str, Any]) -> str:
    return derivation.digest(dict(ident))


# A default: the largest stored wheel read back (the engine wheels built so far are < 1 GiB).
MAX_WHEEL = 2 * untrusted.GiB


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(doc), sort_keys=True, separators=(",", ":")).encode()


def signed_entry(key: bytes, index: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` with its signature: HMAC-SHA256 (``key``) over the index key it is
    stored under and its canonical JSON (another key, index or byte: no entry)."""
    body = json.loads(json.dumps({k: v for k, v in entry.items() if k != "signature"}))
    payload = index.encode() + b"\0" + _canonical(body)
    return {**body, "signature": keyfile.sign(key, _PURPOSE, payload)}


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
    key: bytes = field(repr=False)  # what entries are signed and checked with

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
        index = _index_key(
            record["identity"], identity_key(json.loads(json.dumps(dict(match), sort_keys=True)))
        )
        entry = signed_entry(self.key, index, entry)
        try:
            self.backend.send(_blob_key(sha), Path(wheel), sha)
            self.backend.write(index, json.dumps(entry, sort_keys=True).encode())
        except objbackends.Unavailable as exc:
            return False, f"not stored in the object store: {_said(exc)}"
        return True, "stored in the object store"

    def lookup(
        self, ident: Mapping[str, Any], match: Mapping[str, Any], *, expect: Expect | None = None
    ) -> Hit | Miss:
        """The stored build of this identity whose ``match`` facts (the export's digest,
        version, date, the caller's flags) are equal, signed with this runner's key and
        checked; a :class:`Miss` saying why not (no entry, unsigned or signed with another
        key, an unusable record, the backend unreachable). ``expect``: what this build
        makes, held against the record here and against the wheel by :meth:`take`."""
        want = json.loads(json.dumps(dict(match), sort_keys=True))
        key = _index_key(ident, identity_key(want))
        raw = self._signed(key, "record")
        if isinstance(raw, Miss):
            return raw
        rec, sha, name = raw.get("record"), raw.get("sha256"), raw.get("wheel")
        if raw.get("match") != want or not isinstance(rec, dict) or not _is_sha(sha):
            return Miss("miss: a record that does not match")
        if rec.get("identity") != json.loads(json.dumps(dict(ident))):
            return Miss("miss: a record of another identity")
        if not isinstance(name, str) or validate.wheel_name_problem(name):
            return Miss("miss: a record naming no valid wheel")
        problem = record_problem(rec, expect or Expect())
        if problem is not None:
            return Miss(f"miss: a record whose {problem}")
        return Hit(_blob_key(str(sha)), name, str(sha), rec, expect or Expect(),
                   str(ident.get("python") or ""))  # fmt: skip

    def _signed(self, key: str, what: str) -> dict[str, Any] | Miss:
        """The entry stored under ``key``, read bounded as strict JSON, of this format and
        signed with this runner's key over ``key`` and its text; else the :class:`Miss`
        saying why (none stored, unreachable, unusable, another format, not signed)."""
        try:
            data = self.backend.read(key, KIND.max_bytes)
        except objbackends.Unavailable as exc:
            return Miss(f"miss: {_said(exc)}")
        if data is None:
            return Miss("miss")
        try:
            raw = untrusted.parse_json(data, KIND, key)
        except PinwheelError as exc:
            return Miss(f"miss: an unusable {what} ({exc.what[:200]})")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            return Miss(f"miss: a {what} of another format")
        sig, good = raw.get("signature"), signed_entry(self.key, key, raw)["signature"]
        if not isinstance(sig, str) or not hmac.compare_digest(sig, good):
            return Miss("miss: an entry this runner's key did not sign")
        return raw

    def _fetch(self, blob: str, target: Path, sha256: str, whose: str) -> str | None:
        """Copy the stored ``blob`` into the new file ``target`` (``O_EXCL``, at most
        :data:`MAX_WHEEL` bytes) and check its sha256; why it is a miss (the caller removes
        what is left), else None. ``whose``: the entry that named it, for the reason."""
        try:
            with open(target, "xb") as out:
                if not self.backend.fetch(blob, out, MAX_WHEEL):
                    return f"miss: {whose} wheel is not in the store"
        except objbackends.Unavailable as exc:
            return f"miss: {_said(exc)}"
        if sha256_file(target) != sha256:
            return f"entry changed, a miss (the stored wheel's sha256 is not {whose})"
        return None

    def take(self, hit: Hit, dist: Path) -> Path | Miss:
        """The stored wheel copied into ``dist`` under its name (at most
        :data:`MAX_WHEEL` bytes), its sha256 checked on the copy: a wheel missing, cut
        off or changed since it was written is a :class:`Miss` and nothing is left."""
        remove_tree(dist, ignore_errors=True)
        dist.mkdir(parents=True)
        target = confine.inside(dist, hit.name, what="wheel")
        why = self._fetch(hit.blob, target, hit.sha256, "the record's")
        if why is None:
            problem = wheel_problem(target, hit.expect, hit.python)
            why = (
                None
                if problem is None
                else f"miss: a stored wheel that is not this build's ({problem})"
            )
        if why is not None:
            target.unlink(missing_ok=True)
            return Miss(why)
        return target


    # ------------------------------------------------------------------ tags

    def put_tag(self, built: Path, built_sha: str, decision: Mapping[str, Any], tagged: Path,
                tagged_sha: str) -> str:  # fmt: skip
        """Store the platform tag of the builder's wheel ``built`` (sha256 ``built_sha``):
        auditwheel's ``decision`` and the retagged copy ``tagged``, so a fresh runner that
        takes this wheel from the store takes its tag too (auditwheel's policy analysis
        read every ELF symbol of the engine's 55 MB wheel, 9.5 s, and the retag 5.9 s).
        Signed as an index entry is; the line for the phase table (never raises)."""
        key = _tag_key(built_sha)
        entry = signed_entry(self.key, key, {
            "format": FORMAT, "built": Path(built).name, "built_sha256": built_sha,
            "decision": dict(decision), "wheel": Path(tagged).name, "sha256": tagged_sha,
        })  # fmt: skip
        try:
            if tagged_sha != built_sha:
                self.backend.send(_blob_key(tagged_sha), Path(tagged), tagged_sha)
            self.backend.write(key, json.dumps(entry, sort_keys=True).encode())
        except objbackends.Unavailable as exc:
            return f"its tag not stored in the object store: {_said(exc)}"
        return "its tag stored in the object store"

    def put_check(self, check_key: str, report: Mapping[str, Any]) -> str:
        """Store a passing check ``report`` under ``check_key`` (the digest of the wheels'
        sha256s, the check spec, pinwheel's wheel rules and the tools by content), signed:
        a fresh runner that took the same wheels from the store does not check them again.
        The line for the phase table (never raises)."""
        if not _is_sha(check_key):
            return "the check not stored: no key"
        key = _check_key(check_key)
        entry = signed_entry(self.key, key, {"format": FORMAT, "report": dict(report)})
        try:
            self.backend.write(key, json.dumps(entry, sort_keys=True).encode())
        except objbackends.Unavailable as exc:
            return f"the check not stored in the object store: {_said(exc)}"
        return "the check stored in the object store"

    def take_check(self, check_key: str) -> dict[str, Any] | Miss:
        """The signed check report stored under ``check_key`` (a mapping the caller decodes
        and holds to its wheels), or why not."""
        if not _is_sha(check_key):
            return Miss("miss: no key")
        raw = self._signed(_check_key(check_key), "check entry")
        if isinstance(raw, Miss):
            return raw
        report = raw.get("report")
        if not isinstance(report, dict) or _text_problem(report, lines=True):
            return Miss("miss: a check entry of the wrong shape")
        return report

    def take_tag(self, built: Path, built_sha: str) -> tuple[Path, dict[str, Any]] | Miss:
        """The stored tag of the wheel ``built`` (whose bytes have ``built_sha``): the
        tagged copy written beside it, its sha256 checked, and the decision (a mapping the
        caller decodes). A :class:`Miss` when there is none, it is not signed with this
        runner's key, or it does not describe this wheel: its name, version, build and
        interpreter/ABI tags equal ``built``'s, only the platform the decision names."""
        raw = self._signed(_tag_key(built_sha), "tag entry")
        if isinstance(raw, Miss):
            return raw
        decision, name, sha = raw.get("decision"), raw.get("wheel"), raw.get("sha256")
        problem = _tag_entry_problem(raw, Path(built).name, built_sha)
        if problem is not None or not isinstance(decision, dict):
            return Miss(f"miss: a tag entry that does not describe this wheel ({problem})")
        if sha == built_sha:
            return Path(built), decision
        target = confine.inside(Path(built).parent, str(name), what="wheel")
        target.unlink(missing_ok=True)  # a copy an earlier run left: made anew, not through
        why = self._fetch(_blob_key(str(sha)), target, str(sha), "the entry's")
        if why is not None:
            target.unlink(missing_ok=True)
            return Miss(why)
        return target, decision


def _tag_key(sha256: str) -> str:
    return f"v{FORMAT}/tags/{sha256}.json"


def _check_key(digest: str) -> str:
    return f"v{FORMAT}/checks/{digest}.json"


_PLATFORM = re.compile(r"(linux|manylinux_[0-9]{1,3}_[0-9]{1,4})_[a-z0-9_]{1,20}")


def _tag_entry_problem(raw: Mapping[str, Any], built: str, built_sha: str) -> str | None:
    """Why a tag entry does not describe the wheel named ``built`` (None: it does)."""
    from packaging.tags import Tag
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    decision, name, sha = raw.get("decision"), raw.get("wheel"), raw.get("sha256")
    if raw.get("built") != built or raw.get("built_sha256") != built_sha:
        return "another wheel's"
    if not isinstance(decision, dict) or not isinstance(name, str) or not _is_sha(sha):
        return "fields of the wrong shape"
    plat = decision.get("platform")
    if not isinstance(plat, str) or not _PLATFORM.fullmatch(plat):
        return "no platform tag"
    if validate.wheel_name_problem(name):
        return "no valid wheel name"
    if _text_problem(raw, lines=True):
        return "an escape sequence in its text"
    try:
        b_name, b_ver, b_build, b_tags = parse_wheel_filename(built)
        t_name, t_ver, t_build, t_tags = parse_wheel_filename(name)
    except InvalidWheelFilename:
        return "no valid wheel name"
    want = {Tag(t.interpreter, t.abi, plat) for t in b_tags}
    if (t_name, t_ver, t_build) != (b_name, b_ver, b_build) or set(t_tags) != want:
        return f"{name[:80]} is not {built[:80]} tagged {plat}"
    return None


def _said(exc: PinwheelError) -> str:
    return f"{exc.where}: {exc.what}" if exc.where else exc.what


@dataclass(frozen=True)
class Expect:
    """What this build makes, as far as it is known before it runs: a hit must be it.
    ``version``: the version the build stamps (None: whatever the tree says); ``name``:
    the project name its ``pyproject.toml`` declares (:func:`project_name`); ``tree``:
    the git tree it exports."""

    name: str | None = None
    version: str | None = None
    tree: str | None = None


def project_name(tree: Path) -> str | None:
    """``[project] name`` of ``tree``'s ``pyproject.toml`` when it declares it (not
    dynamic), read bounded and never through a link; None otherwise."""
    try:
        raw = untrusted.read_beneath(Path(tree), "pyproject.toml", _PYPROJECT)
        doc = tomllib.loads(raw.decode("utf-8"))
    except (PinwheelError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    project = doc.get("project")
    if not isinstance(project, dict) or "name" in (project.get("dynamic") or ()):
        return None
    name = project.get("name")
    return name if isinstance(name, str) and _NAME.fullmatch(name) else None


_PYPROJECT = untrusted.Kind("pyproject.toml", 4 * untrusted.MiB, 64, PinwheelError, "")
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")
_GIT_ID = re.compile(f"{validate.GIT_SHA_HEX}|{validate.SHA256_HEX}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# The record's fields (reuse.Recorder.collect) and what each must be.
_RECORD_FIELDS = frozenset(
    ("digest", "tree", "identity", "methods", "complete", "compiled_sources", "files",
     "compiled_members", "from_tree")
)  # fmt: skip


_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _text_problem(value: Any, *, lines: bool = False) -> str | None:
    """A control character (an escape sequence, a newline) in any text of ``value``;
    ``lines``: newlines and tabs allowed (a tool's output kept in a check report)."""
    if isinstance(value, str):
        bad = (_CONTROL_BUT_LINES if lines else _CONTROL).search(value)
        return "text holds a control character" if bad else None
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list):
        return next((p for v in value if (p := _text_problem(v, lines=lines)) is not None), None)
    return None


def _members_problem(value: Any, digest: re.Pattern[str]) -> str | None:
    if not isinstance(value, dict):
        return "not a mapping"
    for member, sha in value.items():
        if validate.member_problem(member) is not None:
            return f"member name {member[:80]!r} is not a plain relative name"
        if not isinstance(sha, str) or not digest.fullmatch(sha):
            return f"member {member[:80]!r} has no digest"
    return None


def record_problem(rec: Mapping[str, Any], expect: Expect, *, whole: bool = True) -> str | None:
    """What is wrong with a stored record's facts (None: nothing): the fields a record
    has, each typed, the tree this build's, no control character anywhere. ``whole``:
    the digest and identity must be there (False: each field typed where it is)."""
    unknown = sorted(set(rec) - _RECORD_FIELDS)
    if unknown:
        return f"fields {unknown[:5]} are not a record's"
    ident = rec.get("identity", None if whole else {})
    if not isinstance(ident, dict) or not isinstance(rec.get("methods", []), list):
        return "identity is not an object, or methods not a list"
    tree = rec.get("tree")
    if tree is not None and (not validate.is_git_object_id(tree)):
        return "tree is not a git id"
    if expect.tree is not None and tree != expect.tree:
        return f"tree {str(tree)[:12]} is not this build's {expect.tree[:12]}"
    if (whole or "digest" in rec) and not validate.is_sha256(rec.get("digest")):
        return "digest is not a sha256"
    for name, digest in (("compiled_members", validate.SHA256), ("files", _GIT_ID)):
        problem = _members_problem(rec.get(name, {}), digest)
        if problem is not None:
            return f"{name}: {problem}"
    from_tree = rec.get("from_tree", [])
    if not isinstance(from_tree, list) or any(
        not isinstance(m, str) or validate.member_problem(m) for m in from_tree
    ):
        return "from_tree is not a list of member names"
    if (
        not isinstance(rec.get("complete", False), bool)
        or type(rec.get("compiled_sources", 0)) is not int
    ):
        return "complete / compiled_sources are not typed"
    problem = _text_problem(rec)
    return None if problem is None else problem


def _tag_ok(tag: str, python: str) -> bool:
    interp, abi, plat = tag.split("-")
    major, _, rest = python.partition(".")
    cp = f"cp{major}{rest.partition('.')[0]}"
    return (
        interp in (cp, f"py{major}", f"py{cp[2:]}")
        and abi in (cp, "abi3", "none")
        and (plat == "any" or plat.endswith("_" + platform.machine()))
    )


def wheel_problem(wheel: Path, expect: Expect, python: str) -> str | None:
    """Where the wheel ``wheel`` is not what this build makes (None: it is): its METADATA
    and WHEEL must agree with its file name, its version be ``expect.version``, its name
    ``expect.name``, and every tag one ``python`` on this machine installs."""
    meta = metadata.read_path(wheel)
    if meta.problems:
        return meta.problems[0][:200]
    if expect.version is not None and canonicalize_version(str(meta.version)) != \
            canonicalize_version(expect.version):  # fmt: skip
        return f"version {str(meta.version)[:40]!r} is not this build's {expect.version!r}"
    if expect.name is not None and canonicalize_name(str(meta.name)) != \
            canonicalize_name(expect.name):  # fmt: skip
        return f"name {str(meta.name)[:40]!r} is not this build's {expect.name!r}"
    bad = sorted(t for t in meta.tags if not _tag_ok(t, python))
    if bad or not meta.tags:
        return f"tags {bad[:3] or 'none'} are not this Python's ({python or 'unknown'})"
    return None


@dataclass(frozen=True)
class Hit:
    blob: str  # the wheel's key in the store
    name: str  # the wheel's file name as built
    sha256: str
    record: Mapping[str, Any]  # its compiled inputs, checked (record_problem)
    expect: Expect = Expect()  # what this build makes (held to the wheel by take)
    python: str = ""  # the identity's Python version (the tags a hit may have)

    def reused(self) -> dict[str, Any]:
        """The reuse record provenance carries (as for ``--reuse-from``): the checked facts."""
        return {
            "from": "the object store",
            "wheel": self.name,
            "wheel_sha256": self.sha256,
            "tree": self.record.get("tree"),
            "why": "an entry this runner's key signed, for the same exported tree, toolchain, "
            "flags and environment (a cached build, not rebuilt here: verify-build rebuilds)",
            "members": dict(self.record.get("compiled_members") or {}),
        }


def store_key(plan: compcache.Plan) -> bytes:
    """The key entries are signed with: ``PINWHEEL_STORE_KEY``, else the cache's own
    (:func:`pinwheel.keyfile.cache_key`). :class:`pinwheel.keyfile.NoKey` when neither."""
    if plan.store_key is not None:
        return keyfile.given_key(plan.store_key, "PINWHEEL_STORE_KEY")
    if plan.cache is None:
        raise keyfile.NoKey("no cache to keep a key in", where="the object store",
                            next="export PINWHEEL_STORE_KEY (at least 32 characters)")  # fmt: skip
    return keyfile.cache_key(plan.cache, KEY_NAME)


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
        backend = make(plan.store, aws or AwsCredentials())
    except ValueError as exc:
        return None, f"the {plan.backend} settings cannot be read: {exc}"
    try:
        key = store_key(plan)
    except keyfile.NoKey as exc:
        return None, f"no key to sign entries with: {_said(exc)}"
    try:
        backend.check()
    except objbackends.Unavailable as exc:
        return None, f"the {plan.backend} store is unreachable: {_said(exc)}"
    return Store(backend, key), backend.describe()


__all__ = [
    "MAX_WHEEL",
    "signed_entry",
    "Expect",
    "Hit",
    "Miss",
    "Store",
    "caller_flags",
    "for_plan",
    "identity_key",
    "project_name",
    "record_problem",
    "store_key",
    "wheel_problem",
]
