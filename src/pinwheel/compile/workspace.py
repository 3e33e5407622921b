"""A component's kept export and build tree: incremental rebuilds that give cold bytes.

Each component builds in one directory under the cache (``src/`` the export,
the builder's build tree beside or inside it), kept between builds while its
key (the compiled-input identity: toolchain, flags, builder, Python, torch,
and how paths are made canonical) stays the same. The export is updated in
place: a file is written only when its bytes changed (:attr:`Synced.changed`
names them), every other file is left alone, files the new tree dropped are
deleted, and build products the builder left are kept. A different key, or a
cold build (``--no-cache``, ``verify-build``), wipes the directory first.

Every exported file carries one fixed mtime, :data:`SOURCE_MTIME`: compilers write
source mtimes into what they make (ptxas with ``-lineinfo`` puts each source's
mtime in the cubin's line table; gcc's ``__TIMESTAMP__``), so export times made two
builds of one tree differ. File times then say nothing about what changed:
:mod:`pinwheel.compile.invalidate` removes what the changed files reached instead.

A build that changed nothing at all (same key, same exported bytes, same
environment) does not run the builder: :func:`remember` stamps each finished
build with a digest of everything it was given, and :func:`last_build` hands
back that build's wheel (sha256 checked) and record when the digest matches.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import archive, confine, locking, options, untrusted, validate
from pinwheel.checksums import sha256_file
from pinwheel.compile import stamps
from pinwheel.compile.derivation import Derivation, because, changed, digest
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import remove_tree

STAMP = ".pinwheel-workspace.json"
LAST = "last-build.json"
PENDING = ".pinwheel-update-pending"  # between updating the export and invalidating
SOURCE_MTIME = 315532800  # 1980-01-01T00:00:00Z, the zip epoch: every exported file's mtime
# What a builder reads from the environment beside what pinwheel sets: a change starts a
# real (incremental) build instead of handing back the last wheel.
COMPILER_ENV = (
    "PATH", "CC", "CXX", "CUDAHOSTCXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS",
    "CUDAFLAGS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "CPATH", "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "LD_LIBRARY_PATH", "PYTHONPATH",
)  # fmt: skip
SKIP_DIRS = frozenset({"build", "dist", "__pycache__", ".git", "_skbuild"})


@dataclass(frozen=True)
class Entry:
    """One file of an export: bytes (or a link target) and whether it is executable."""

    rel: str
    data: bytes
    executable: bool = False
    link: str | None = None


@dataclass(frozen=True)
class Synced:
    """What an in-place update did."""

    written: tuple[str, ...]  # new or changed files
    removed: tuple[str, ...]
    kept: int  # unchanged files (not rewritten)
    digest: str = ""  # sha256 over every exported file's name, mode, link and bytes

    @property
    def changed(self) -> tuple[str, ...]:
        return self.written + self.removed


@dataclass(frozen=True)
class LastBuild:
    """The wheel a finished build left in the workspace, and its build record."""

    wheel: Path
    record: Mapping[str, Any]
    how: str = ""  # how its sha256 was confirmed: by its file stamp, or hashed


# What a workspace keeps (its key stamp, the export's listing, the last build's record):
# read bounded, never through a link, never waiting on a FIFO; a bad one is no record.
RECORD = untrusted.Kind("workspace record", 64 * untrusted.MiB, 16, PinwheelError,
                        "nothing: the workspace is prepared, exported or built again")  # fmt: skip


def _read(path: Path) -> Any:
    """The JSON document at ``path`` (bounded, a regular file reached through no link in
    its folder), or None when it is missing, not a regular file, too large or not JSON."""
    try:
        raw = untrusted.read_beneath(path.parent, path.name, RECORD)
        return untrusted.parse_json(raw, RECORD, str(path))
    except PinwheelError:
        return None


def _write(path: Path, text: str) -> None:
    """``text`` at ``path``, atomically, a link there replaced (never written through)."""
    confine.write_beneath(path.parent, path.name, text.encode())


LOCK_TIMEOUT_S = 600  # a default, the cache lock's: a second build waits this long


@contextlib.contextmanager
def locked(root: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[Path]:
    """Hold the workspace ``root`` for one build, as the cache lock holds a repository: a
    second build on the same cache waits, then fails clearly; it never writes the same
    export, build tree or record at the same time. The lock file lies beside the
    workspace (``prepare`` may wipe the workspace itself)."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.parent / f".{root.name}.lock"
    with locking.held(
        lock_path,
        timeout_s=timeout_s,
        what=f"another pinwheel build has held the workspace {root}",
        next="wait for it to finish, or pass --cache DIR to build in a separate cache",
    ):
        yield root


def key_of(identity: Mapping[str, Any]) -> str:
    """The workspace key of a compiled-input identity (:func:`derivation.digest`)."""
    return digest(dict(identity))


def prepare(root: Path, key: str | Derivation, *, cold: bool) -> bool:
    """Make ``root`` ready for a build keyed ``key`` (a derivation's key, the record kept in
    the stamp for :func:`rebuild_reason`); True when earlier work is kept."""
    derivation = key if isinstance(key, Derivation) else None
    key = key.key if isinstance(key, Derivation) else key
    kept = not cold and _stamped(root).get("key") == key
    if not kept and root.exists():
        remove_tree(root)
    root.mkdir(parents=True, exist_ok=True)
    if not kept:  # stamped now: a build that dies half-way is resumed, not trusted blindly
        doc: dict[str, Any] = {"key": key}
        if derivation is not None:
            doc["derivation"] = derivation.to_json()
        _write(root / STAMP, json.dumps(doc, sort_keys=True) + "\n")
    return kept


def rebuild_reason(root: Path, derivation: Derivation, *, cold: bool) -> str | None:
    """Why a build keyed by ``derivation`` cannot keep ``root`` (None: it can): the fields
    that differ from the derivation the kept workspace was built from, by
    :func:`pinwheel.compile.derivation.changed`. Call it before :func:`prepare`."""
    if cold:
        return "rebuilt because: a cold build was asked for (no compiler cache, no kept tree)"
    doc = _stamped(root)
    if not doc:
        return "rebuilt because: no earlier build in this workspace"
    if doc.get("key") == derivation.key:
        return None
    earlier = doc.get("derivation")
    if not isinstance(earlier, Mapping) or not isinstance(earlier.get("inputs"), Mapping):
        return "rebuilt because: the earlier build recorded no derivation (an older pinwheel)"
    return because(changed(earlier["inputs"], dict(derivation.inputs)))


def _stamped(root: Path) -> dict[str, Any]:
    """The workspace stamp, read bounded as a regular file ({} when missing or unreadable:
    then nothing is kept)."""
    doc = _read(root / STAMP)  # never through a link, no FIFO waited on
    return doc if isinstance(doc, dict) else {}


def dir_entries(source: Path, skip: Iterable[str] = SKIP_DIRS) -> Iterator[Entry]:
    """Files of a checkout directory (build outputs and VCS dirs aside), walked by
    :func:`pinwheel.confine.walk`: no link followed, every link resolved inside ``source``
    (a chain leading out is refused), a FIFO or device refused."""
    skipped = set(skip)
    for node in confine.walk(
        source, skip=lambda name: name in skipped or name.endswith(".egg-info")
    ):
        if node.kind == "link":
            yield Entry(node.rel, b"", link=node.link)
        elif node.kind == "file":
            data = confine.read_beneath(source, node.rel)
            yield Entry(node.rel, data, executable=bool(node.mode & stat.S_IXUSR))


def tar_entries(raw: bytes, prefix: str = "src/") -> Iterator[Entry]:
    """Files of an uncompressed tar (``git archive``), ``prefix`` removed, read by the one
    archive reader (:func:`pinwheel.archive.tree_members`): names checked, links resolved
    as a whole tree (chains, links out, members under a link refused)."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        members = archive.tree_members(tar, "the exported tree")
    for member, data in members:
        rel = member.name.removeprefix(prefix)
        if not rel or member.isdir():
            continue
        if member.issym():
            yield Entry(rel, b"", link=member.linkname)
        elif data is not None:
            yield Entry(rel, data, executable=bool(member.mode & 0o100))


def sync(
    dest: Path, entries: Iterable[Entry], listing: Path, *, mtime: int | None = SOURCE_MTIME
) -> Synced:
    """Update ``dest`` to hold exactly ``entries`` among the files ``listing`` says were
    exported last time; write only what changed. Every file ends with ``mtime`` (None:
    written files keep the time of writing). Every write and delete goes through
    :mod:`pinwheel.confine`'s ``*_beneath`` steps: no symlink on the way is gone through
    (one planted, or left by the last tree, cannot lead a write or a delete out)."""
    listed = _read(listing)
    previous = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
    written: list[str] = []
    now: list[str] = []
    kept = 0
    digest = hashlib.sha256()
    dest.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        now.append(entry.rel)
        content = entry.link if entry.link is not None else hashlib.sha256(entry.data).hexdigest()
        digest.update(json.dumps([entry.rel, entry.executable, entry.link is not None, content])
                      .encode() + b"\n")  # fmt: skip
        if _same(dest, entry):
            kept += 1
            _set_mtime(dest, entry.rel, mtime)
            continue
        if entry.link is not None:
            confine.symlink_beneath(dest, entry.rel, entry.link)
        else:
            confine.write_beneath(
                dest, entry.rel, entry.data, mode=0o755 if entry.executable else 0o644
            )
        _set_mtime(dest, entry.rel, mtime)
        written.append(entry.rel)
    removed = sorted(previous - set(now))
    for rel in removed:
        st = confine.lstat_beneath(dest, rel) if _listed(rel) else None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            confine.remove_beneath(dest, rel)
    _write(listing, json.dumps(sorted(now)) + "\n")
    return Synced(tuple(written), tuple(removed), kept, digest.hexdigest())


def adopt(staged: Path, dest: Path, listing: Path, *, mtime: int = SOURCE_MTIME) -> Synced:
    """A fresh export: the directory ``staged`` (pinwheel's own export, beside ``dest`` on
    the same file system) becomes ``dest`` by one rename, its files given what :func:`sync`
    gives them (mode 0755 or 0644, ``mtime``) first and ``listing`` written after, instead
    of every file read, compared and written again one path walk at a time (the two build
    sources of the 1Cat-vLLM engine, 13,600 files and 309 MB, took 49 s that way in a fresh
    workspace on two busy cores). ``dest`` must not exist. Walked by :func:`confine.walk`:
    a link leading out, a FIFO or a device in ``staged`` is refused, never adopted."""
    if os.path.lexists(dest):
        raise FileExistsError(dest)
    rels: list[str] = []
    for node in confine.walk(staged):
        if node.kind == "dir":
            continue
        path = staged / node.rel
        if node.kind == "file":
            os.chmod(path, 0o755 if node.mode & stat.S_IXUSR else 0o644)  # a regular file (walk)
        os.utime(path, (mtime, mtime), follow_symlinks=False)
        rels.append(node.rel)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staged, dest)
    _write(listing, json.dumps(sorted(rels)) + "\n")
    return Synced(tuple(sorted(rels)), (), 0)


def _listed(rel: object) -> bool:
    """A name from the listing (a file pinwheel wrote) that stays inside the export."""
    return isinstance(rel, str) and validate.member_problem(rel) is None


def sync_tree(result: Any, dest: Path, listing: Path, exclude: Sequence[str] = ()) -> Synced:
    """Update ``dest`` in place to a replayed tree (a ``ReplayResult``): only files whose
    bytes changed are written; ``exclude``: pathspecs left out (``[build] exclude``).

    When the last export was of the same tree id with the same excludes and every file it
    wrote still carries the stamp recorded after it (:func:`held_export`), nothing is read
    or written: the tree id names the bytes, the stamps say nobody touched them."""
    from pinwheel.source.export import tree_archive  # pygit2: only when a tree is synced

    of = {"tree": str(result.tree), "exclude": list(exclude)}
    held = held_export(dest, listing, of)
    if held is not None:
        return held
    export_stamp(listing).unlink(missing_ok=True)  # gone until the files are as recorded
    synced = sync(dest, tar_entries(tree_archive(result, exclude)), listing)
    _stamp_export(dest, listing, of, synced.digest)
    return synced


EXPORT_STAMP_FORMAT = 1


def export_stamp(listing: Path) -> Path:
    """Where the stamp of the export ``listing`` describes lives (beside it)."""
    return listing.with_name(listing.stem + ".stamp.json")


def _file_stamps(dest: Path, rels: Iterable[str]) -> dict[str, list[int]] | None:
    """rel -> [mode, size, mtime_ns, ctime_ns, inode, device] by ``lstat``; None when a
    name is not one an export writes or a file is gone."""
    out: dict[str, list[int]] = {}
    for rel in rels:
        if not _listed(rel):
            return None
        try:
            st = os.lstat(dest / rel)
        except OSError:
            return None
        out[rel] = [st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                    st.st_dev]  # fmt: skip
    return out


def _stamp_export(dest: Path, listing: Path, of: Mapping[str, Any], digest: str) -> None:
    rels = _read(listing)
    files = _file_stamps(dest, rels) if isinstance(rels, list) else None
    if files is None:
        return
    doc = {"format": EXPORT_STAMP_FORMAT, "of": dict(of), "digest": digest, "files": files}
    _write(export_stamp(listing), json.dumps(doc, sort_keys=True) + "\n")


def held_export(dest: Path, listing: Path, of: Mapping[str, Any]) -> Synced | None:
    """The last export of ``of`` (tree id and excludes) as :class:`Synced` with nothing
    written, when its stamp (read bounded and never through a link, by
    :mod:`pinwheel.untrusted`) is for the same ``of`` and every file it lists still has the
    recorded mode, size, mtime, ctime, inode and device (a rewrite changes ctime, which
    ``utime`` cannot set back; a replacement the inode). Anything else, a malformed stamp
    included: None (a full sync)."""
    stamp, kind = export_stamp(listing), untrusted.EXPORT_STAMP
    try:  # no link followed, no FIFO waited on
        doc = untrusted.parse_json(untrusted.read_beneath(stamp.parent, stamp.name, kind),
                                   kind, str(stamp))  # fmt: skip
    except PinwheelError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_STAMP_FORMAT:
        return None
    files, digest = doc.get("files"), doc.get("digest")
    if doc.get("of") != dict(of) or not isinstance(files, dict) or not validate.is_sha256(digest):
        return None
    listed = _read(listing)
    if not isinstance(listed, list) or sorted(listed) != sorted(files):
        return None
    if _file_stamps(dest, files) != files:
        return None
    return Synced((), (), len(files), str(digest))


def inputs_digest(*, key: str, sources: Sequence[str], env: Mapping[str, str], **facts: Any) -> str:
    """Everything a build is given: the workspace key, the exported sources' digests, the
    environment the builder reads (pinwheel's and :data:`COMPILER_ENV` of the caller's)
    and any other fact that reaches the bytes (date, version, command)."""
    return key_of({"key": key, "sources": list(sources), "env": dict(env), "facts": facts})


def builder_env(env: Mapping[str, str], set_env: Mapping[str, str]) -> dict[str, str]:
    """The part of a build's environment :func:`inputs_digest` covers."""
    return {**options.select(env, COMPILER_ENV), **set_env}


def last_build(root: Path, inputs: str) -> LastBuild | None:
    """The last finished build's wheel when it was given exactly ``inputs`` and the wheel
    is still there with the bytes it was stamped with; else None."""
    stamp = _read(root / LAST)
    try:
        rel = stamp["wheel"]
        # A name inside the workspace (``dist/x.whl``), a plain file reached through no link:
        # never ``../../elsewhere/x.whl`` or a path through a planted link.
        if not isinstance(rel, str) or validate.member_problem(rel) is not None:
            return None
        st = confine.lstat_beneath(root, rel)
        wheel = root / rel
        if stamp["inputs"] != inputs or st is None or not stat.S_ISREG(st.st_mode):
            return None
        # The wheel's file stamp answers when it still holds; else its bytes are hashed.
        got = stamps.sha256_of(wheel, stamps.Stamp.from_json(stamp.get("stamp")))
        if got.sha256 != stamp["sha256"]:
            return None
        return LastBuild(wheel, stamp["record"], got.how)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def forget(root: Path) -> None:
    """Before a build starts: the stamp would no longer describe the workspace."""
    (root / LAST).unlink(missing_ok=True)


def remember(root: Path, inputs: str, wheel: Path, record: Mapping[str, Any]) -> None:
    """After a build finished: stamp the wheel (under ``root``) with what it was given."""
    taken = stamps.take(wheel)
    stamp = {
        "inputs": inputs,
        "wheel": str(Path(wheel).relative_to(root)),
        "sha256": taken.sha256 if taken is not None else sha256_file(wheel),
        "stamp": taken.to_json() if taken is not None else None,
        "record": dict(record),
    }
    _write(root / LAST, json.dumps(stamp, sort_keys=True) + "\n")


def begin_update(root: Path) -> bool:
    """Before the export is updated in place: mark the update. True when an earlier one
    never reached :func:`end_update` (stopped between rewriting files and removing what
    they reached): its changes are no longer visible, so the build tree must go."""
    interrupted = os.path.lexists(root / PENDING)
    _write(root / PENDING, "the export is being updated\n")
    return interrupted


def end_update(root: Path) -> None:
    """The build tree has been told what the update changed."""
    (root / PENDING).unlink(missing_ok=True)


def fix_header_times(venv: Path, mtime: int = SOURCE_MTIME) -> int:
    """Give every file under an ``include`` directory of ``venv``'s site-packages (torch's
    and the nvidia wheels' headers, which pip writes at install time) ``mtime``: their
    mtimes reach cubins like the sources' do. Returns how many files were set."""
    headers = {
        path
        for site in venv.glob("lib/python*/site-packages")
        for include in site.rglob("include")
        if include.is_dir()
        for path in include.rglob("*")  # an include/ inside an include/ is walked twice
        if path.is_file() and not path.is_symlink()
    }
    for path in headers:
        _set_mtime(venv, path, mtime)
    return len(headers)


def _set_mtime(root: Path, rel: str | Path, mtime: int | None) -> None:
    if mtime is None:
        return
    if isinstance(rel, Path):  # a file found by a walk of pinwheel's own venv
        if rel.lstat().st_mtime_ns != mtime * 1_000_000_000:
            os.utime(rel, (mtime, mtime), follow_symlinks=False)
        return
    st = confine.lstat_beneath(root, rel)
    if st is not None and st.st_mtime_ns != mtime * 1_000_000_000:
        confine.set_mtime_beneath(root, rel, mtime)


def _same(root: Path, entry: Entry) -> bool:
    st = confine.lstat_beneath(root, entry.rel)
    if st is None:
        return False
    if entry.link is not None:
        return stat.S_ISLNK(st.st_mode) and os.readlink(root / entry.rel) == entry.link
    if not stat.S_ISREG(st.st_mode):
        return False
    if st.st_size != len(entry.data) or bool(st.st_mode & stat.S_IXUSR) != entry.executable:
        return False
    return confine.read_beneath(root, entry.rel) == entry.data
