"""Reuse of compiled members: ``--reuse-from <release dir | URL | wheel>``.

At build time every producer records its *compiled inputs* in provenance
(``compiled_inputs``): the source-tree files the compilers read, taken from
the build's own dependency output (``DEPENDENCIES_OUTPUT`` appended by every
gcc/cc1plus call, including nvcc's host and device preprocessing; ``*.d``
depfiles and ``ninja -t deps`` under the build dirs), plus the build files
(setup.py, pyproject.toml, setup.cfg, CMakeLists.txt, *.cmake), each with its
git blob id; and the identity of what compiles (nvcc and host compiler
versions and binaries, Python, builder, the environment pinwheel set, arches).

At reuse time the earlier wheel is verified against its SHA256SUMS and
provenance, then reused only when the identity is equal and every recorded
path has the same blob id in the new tree (and no build file appeared or
went). Then:

- a tree whose setup.py knows ``VLLM_PRECOMPILED_WHEEL_LOCATION`` (vLLM
  family) is built by its own mechanism (``VLLM_USE_PRECOMPILED=1``);
- any other project gets a transplant: the earlier wheel's members, with the
  members that were copies of tree files replaced by the new tree's files
  (new modules beside them added, deleted ones dropped), repacked with
  ``wheel pack`` under ``SOURCE_DATE_EPOCH``. Compiled members (ELF) come from
  the earlier wheel unchanged.

Provenance lists each reused member with its sha256 and the tree and wheel it
came from. ``verify-build`` still rebuilds from source and compares.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import archive, confine, runner, untrusted, validate
from pinwheel.checksums import SUMS, parse_sums, sha256_file
from pinwheel.compile import derivation
from pinwheel.errors import PinwheelError, VerifyError
from pinwheel.fsutil import atomic_write_bytes, remove_tree
from pinwheel.net import httpget
from pinwheel.progress import SILENT, Reporter
from pinwheel.urls import redact
from pinwheel.wheels.provenance import FILENAME, read_receipt

BUILD_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "CMakeLists.txt")
# Environment pinwheel sets that does not reach compiled code: dates and version labels.
_NOT_COMPILED = ("SOURCE_DATE_EPOCH", "SETUPTOOLS_SCM_PRETEND_VERSION", "VLLM_VERSION_OVERRIDE")
_SKIP_DIRS = {".git", "build", "dist", "__pycache__", "_skbuild", ".eggs"}


# A compiled input (a source file, a header, a build script) larger than this is no
# source file: a default, far above any file of the engines' trees (their largest are
# generated headers of a few MB).
MAX_INPUT = 256 * 1024 * 1024


def blob_id(path: Path, *, cap: int | None = None) -> str:
    """git's blob id of a regular file (what ``git hash-object`` prints), streamed: the
    size is checked against ``cap`` before a byte is read; a FIFO or device is refused."""
    kind = untrusted.Kind("compiled input", cap or 1 << 62, 0, ReuseError,
                          "drop --reuse-from to build from source")  # fmt: skip
    size = untrusted.regular_size(path, kind)
    digest = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    fd = untrusted.open_regular(path)
    with open(fd, "rb", buffering=0) as fh:
        got = 0
        while block := fh.read(1 << 20):
            digest.update(block)
            got += len(block)
    if got != size:
        raise kind.error(f"compiled input changed while read ({got} of {size} bytes)",
                         where=str(path), next="run the build again")  # fmt: skip
    return digest.hexdigest()


def _run_text(cmd: list[str]) -> str:
    try:
        out = runner.run(runner.Command(tuple(cmd), timeout=60, check=False))
    except PinwheelError:  # not there, or hung
        return ""
    return out.stdout.decode(errors="replace") if out.returncode == 0 else ""


def identity(
    set_env: Mapping[str, str],
    *,
    toolkit: Any,
    python: str,
    builder: str,
    inputs: Mapping[str, Any] | None = None,
    placeholders: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What compiles, as recorded: a different nvcc or host compiler is a different build.

    ``inputs``: what else reaches the compilers from outside the tree (the build
    sources' exported digests, the build requirements' hash: a new cutlass commit, a
    changed patch or another torch is another build). ``placeholders``: machine paths
    in the environment (the cache, the scratch dir) and the names that replace them,
    so an identity recorded on one builder matches on another.
    """
    nvcc = Path(toolkit.nvcc).resolve() if toolkit is not None else None
    cc = shutil.which("gcc") or shutil.which("cc")
    return {
        "builder": builder,
        "nvcc": [toolkit.version, sha256_file(nvcc)] if nvcc and nvcc.is_file() else None,
        "host_cc": (_run_text([cc, "--version"]).splitlines() or [""])[0] if cc else None,
        "python": _run_text([python, "-c", "import sys; print(sys.version.split()[0])"]).strip(),
        "env": {
            k: portable(v, placeholders or {})
            for k, v in sorted(set_env.items())
            if k not in _NOT_COMPILED
        },
        **({"inputs": dict(inputs)} if inputs else {}),
    }


def portable(value: str, placeholders: Mapping[str, str]) -> str:
    """``value`` with each machine path of ``placeholders`` (longest first) replaced by its
    name, where the path ends there or a ``/`` follows (``/opt/py`` is not a part of
    ``/opt/python``): what an identity or provenance records instead of this machine's paths."""
    for path, name in sorted(placeholders.items(), key=lambda kv: -len(kv[0])):
        value = re.sub(re.escape(path) + r"(?![\w.-])", name.replace("\\", r"\\"), value)
    return value


def parse_depfile(text: str) -> list[str]:
    """Prerequisites of a make-style depfile (``target: a b \\`` continuations)."""
    out: list[str] = []
    for rule in text.replace("\\\n", " ").splitlines():
        if ":" not in rule:
            continue
        _, _, deps = rule.partition(": ")
        if not deps and rule.endswith(":"):
            continue
        out += [d for d in deps.replace("\\ ", "\0").split() if d]
    return [d.replace("\0", " ") for d in out]


def is_build_file(rel: str) -> bool:
    """setup.py, CMakeLists.txt, *.cmake ...: outside build outputs and VCS dirs."""
    *dirs, name = Path(rel).parts
    return not _SKIP_DIRS.intersection(dirs) and (name in BUILD_FILES or name.endswith(".cmake"))


def build_files(source: Path) -> list[str]:
    found: list[str] = []
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        rels = (str((Path(root) / name).relative_to(source)) for name in files)
        found.extend(rel for rel in rels if is_build_file(rel))
    return sorted(found)


def tree_files(source: Path) -> frozenset[str]:
    """Every file under ``source`` (``.git`` aside), relative."""
    found: set[str] = set()
    for root, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != ".git"]
        found.update(str((Path(root) / name).relative_to(source)) for name in files)
    return frozenset(found)


@dataclass
class Recorder:
    """Collects the compiled inputs of one build of ``source``.

    Made before the build starts: the files present then (the exported tree) are the
    only candidates. What the build writes into the tree (CMake's ``.deps/*-build``
    and ``*-subbuild`` with machine paths, generated headers, ``_version.py``) is
    output, made from recorded inputs; recorded, it would differ for every tree path
    and no build could ever be reused."""

    source: Path
    scan: tuple[Path, ...]  # build dirs with *.d depfiles / ninja logs
    alias: Path | None = None  # how the compilers spelled ``source`` (the canonical path)
    depfile: Path = field(init=False)
    before: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.source = Path(self.source).resolve()
        self.before = tree_files(self.source)
        self.depfile = Path(tempfile.mkdtemp(prefix="pinwheel-deps-")) / "inputs.d"

    def env(self) -> dict[str, str]:
        """gcc's cc1/cc1plus append each main file and its non-system headers here."""
        return {"DEPENDENCIES_OUTPUT": str(self.depfile)}

    def _deps(self) -> tuple[set[str], list[str]]:
        found: set[str] = set()
        methods: list[str] = []
        if self.depfile.is_file():
            found.update(parse_depfile(self.depfile.read_text(errors="replace")))
            methods.append("compiler dependency output")
        ninja = shutil.which("ninja") or ""
        spellings = [str(self.source)] + ([str(self.alias)] if self.alias else [])
        prefix = re.compile("(?:" + "|".join(map(re.escape, spellings)) + r")/([^\s\"';:$]+)")
        for base in self.scan:
            if not base.is_dir():
                continue
            for rules in base.rglob("build.ninja"):  # custom commands: generator scripts
                found.update(
                    str(self.source / m) for m in prefix.findall(rules.read_text(errors="replace"))
                )
                methods.append("build.ninja") if "build.ninja" not in methods else None
            for dep in base.rglob("*.d"):
                found.update(parse_depfile(dep.read_text(errors="replace")))
                methods.append("depfiles") if "depfiles" not in methods else None
            for log in base.rglob(".ninja_deps") if ninja else ():
                text = _run_text([ninja, "-C", str(log.parent), "-t", "deps"])
                found.update(ln.strip() for ln in text.splitlines() if ln.startswith("    "))
                methods.append("ninja -t deps") if "ninja -t deps" not in methods else None
        remove_tree(self.depfile.parent, ignore_errors=True)
        if self.alias is not None and self.alias != self.source:
            alias = str(self.alias)
            found = {
                str(self.source) + d[len(alias) :] if d == alias or d.startswith(alias + "/") else d
                for d in found
            }
        return found, methods

    def collect(self, wheel: Path, ident: Mapping[str, Any], *, tree: str | None) -> dict[str, Any]:
        deps, methods = self._deps()
        inside: set[str] = set()
        real = _Resolver()
        src = str(self.source)
        under = src + "/"
        for dep in deps:  # strings, not Paths: a torch build names thousands of headers
            try:
                found = real(dep if os.path.isabs(dep) else os.path.join(src, dep))
            except OSError:
                continue
            rel = found[len(under) :] if found.startswith(under) else None
            if rel is not None and rel in self.before and os.path.isfile(found):
                inside.add(rel)
        compiled_sources = sorted(inside)
        paths = sorted(inside | {p for p in self.before if is_build_file(p)})  # no second walk
        files = {p: blob_id(self.source / p) for p in paths}
        compiled, from_tree = members_of(wheel, self.source)
        digest = derivation.digest({"identity": ident, "files": files})
        return {
            "digest": digest,
            "tree": tree,
            "identity": dict(ident),
            "methods": methods,
            "complete": bool(compiled_sources) or not compiled,
            "compiled_sources": len(compiled_sources),
            "files": files,
            "compiled_members": compiled,
            "from_tree": from_tree,
        }


class _Resolver:
    """``os.path.realpath`` for thousands of headers that share a few directories: each
    directory is resolved once, and a file only when it is itself a link. (Resolving
    every dependency whole, one lstat per path component, took most of a one-file
    rebuild's bookkeeping: torch's headers are thousands of deep paths.)"""

    def __init__(self) -> None:
        self._dirs: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        parent, name = os.path.split(path)
        if name in ("", ".", ".."):
            return os.path.realpath(path)
        real_parent = self._dirs.get(parent)
        if real_parent is None:
            real_parent = self._dirs[parent] = os.path.realpath(parent or ".")
        full = os.path.join(real_parent, name)
        return os.path.realpath(full) if os.path.islink(full) else full


def _tree_file(source: Path, member: str) -> Path | None:
    for candidate in (source / member, source / "src" / member):
        if candidate.is_file():
            return candidate
    return None


def members_of(wheel: Path, source: Path) -> tuple[dict[str, str], list[str]]:
    """(compiled members -> sha256, members that are byte copies of a tree file)."""
    compiled: dict[str, str] = {}
    from_tree: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.endswith("/") or ".dist-info/" in name:
                continue
            data = zf.read(info)
            if data[:4] == b"\x7fELF":
                compiled[name] = hashlib.sha256(data).hexdigest()
                continue
            found = _tree_file(source, name)
            if found is not None and found.read_bytes() == data:
                from_tree.append(name)
    return compiled, sorted(from_tree)


# --------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class Candidate:
    """An earlier, verified wheel and its provenance entry."""

    wheel: Path
    sha256: str
    component: Mapping[str, Any]
    origin: str  # the --reuse-from argument


class ReuseError(PinwheelError):
    """The --reuse-from source cannot be used."""


# --reuse-from over http(s): every GET under a byte cap and a deadline (a trickling or
# endless server is not waited on forever).
REUSE_SMALL = 16 * 1024 * 1024  # SHA256SUMS, provenance.json
REUSE_WHEEL = 8 * 1024**3  # one wheel
REUSE_DEADLINE = 1800.0  # seconds per GET


def _fetch_small(url: str, dest: Path, source: str) -> Path:
    """SHA256SUMS or provenance.json of a --reuse-from URL into ``dest`` (atomically)."""
    try:
        data = httpget.get_bytes(url, what=dest.name, cap=REUSE_SMALL, deadline=REUSE_DEADLINE)
    except PinwheelError as err:
        raise ReuseError(
            err.what,
            where=f"--reuse-from {source} ({err.where})",
            next="check the URL (it must be a pinwheel build or release directory served "
            "over http(s)), or drop --reuse-from to build from source",
        ) from None
    atomic_write_bytes(dest, data)
    return dest


def _fetch_wheel(url: str, dest: Path, sha256: str, source: str) -> Path:
    """A wheel SHA256SUMS lists, hashed while it streams; renamed into place only if it
    matches."""
    try:
        httpget.get_file(url, dest, sha256=sha256, cap=REUSE_WHEEL, deadline=REUSE_DEADLINE)
    except PinwheelError as err:
        raise ReuseError(
            err.what,
            where=f"--reuse-from {source} ({err.where})",
            next="run again, or drop --reuse-from to build from source",
        ) from None
    return dest


def candidates(source: str, cache: Path) -> dict[str, Candidate]:
    """Component name -> verified earlier wheel, from a release dir, URL or wheel file."""
    only: str | None = None
    if source.startswith(("http://", "https://")):
        base = source if source.endswith("/") else source + "/"
        local = confine.inside(
            cache, Path("reuse") / hashlib.sha256(base.encode()).hexdigest()[:16]
        )
        confine.mkdirs(cache, local)
        _fetch_small(base + SUMS, local / SUMS, source)
        _fetch_small(base + FILENAME, local / FILENAME, source)
        directory = local
    else:
        path = Path(source)
        if path.is_file() and path.suffix == ".whl":
            directory, only = path.parent, path.name
        elif path.is_dir():
            directory = path
        else:
            raise ReuseError(
                f"{source} is neither a release directory, a wheel, nor an http(s) URL",
                where="--reuse-from",
                next="point it at a wheels/ or release/ dir (with SHA256SUMS + provenance.json)",
            )
    for needed in (SUMS, FILENAME):
        if not (directory / needed).is_file():
            raise ReuseError(
                f"no {needed} beside the wheels: an unverified wheel is never reused",
                where=f"--reuse-from {source}",
                next="reuse a pinwheel build or release directory",
            )
    sums = parse_sums(untrusted.read_bytes(directory / SUMS, untrusted.SHA256SUMS))
    receipt = read_receipt(directory / FILENAME)
    out: dict[str, Candidate] = {}
    for comp in receipt.entries():
        name = comp.get("wheel")
        if not name or (only and name != only):
            continue
        if validate.wheel_name_problem(name):
            raise VerifyError(
                f"provenance names a wheel that is not a plain wheel file name: "
                f"{str(name)[:120]!r}",
                where=f"--reuse-from {redact(source)}",
                next="reuse a release pinwheel wrote",
            )
        problem = _shape_problem(comp)
        if problem is not None:
            raise VerifyError(
                f"{name}: provenance's entry is not one pinwheel writes ({problem})",
                where=f"--reuse-from {redact(source)}",
                next="reuse a release pinwheel wrote, or drop --reuse-from to build from source",
            )
        if sums.get(name) != comp.get("sha256"):
            raise VerifyError(
                f"{name}: SHA256SUMS and provenance.json disagree",
                where=f"--reuse-from {source}",
                next="reuse an intact release",
            )
        wheel = confine.inside(directory, name, what="wheel")
        if not wheel.is_file() and source.startswith(("http://", "https://")):
            _fetch_wheel(source.rstrip("/") + "/" + name, wheel, str(comp.get("sha256")), source)
        if not wheel.is_file():
            continue
        if sha256_file(wheel) != comp["sha256"]:
            raise VerifyError(
                f"{name}: sha256 differs from SHA256SUMS",
                where=f"--reuse-from {source}",
                next="fetch the release again",
            )
        _archive_check(wheel, comp, source)
        out[str(comp["name"])] = Candidate(wheel, comp["sha256"], comp, source)
    return out


def _shape_problem(comp: Mapping[str, Any]) -> str | None:
    """What in a provenance component ``--reuse-from`` reads is not of its type (a string
    where an object belongs, a member name that is a path...), None when every field is."""
    from pinwheel.compile.objstore import Expect, record_problem

    if not isinstance(comp.get("name"), str) or not validate.is_sha256(comp.get("sha256")):
        return "name or sha256 missing"
    source = comp.get("source")
    if source is not None and not isinstance(source, Mapping):
        return "source is not an object"
    tree = (source or {}).get("tree")
    if tree is not None and not (isinstance(tree, str) and re.fullmatch(r"[0-9a-f]{40,64}", tree)):
        return "source.tree is not a git id"
    rec = comp.get("compiled_inputs")
    if rec is None:
        return None
    if not isinstance(rec, Mapping):
        return "compiled_inputs is not an object"
    problem = record_problem(rec, Expect(), whole=False)
    return None if problem is None else f"compiled_inputs: {problem}"


def _archive_check(wheel: Path, comp: Mapping[str, Any], source: str) -> None:
    """The earlier wheel through the one archive reader and the wheel audit; and every
    compiled member provenance records must be in it with that sha256."""
    from pinwheel.wheels.check import CheckSpec, check_wheels

    where = f"--reuse-from {redact(source)}"
    with zipfile.ZipFile(wheel) as zf:
        infos = {i.filename: i for i in archive.zip_members(zf, f"{where}: {wheel.name}")}
        report = check_wheels([wheel], CheckSpec(arches=(), require_cuda=False))
        if not report.ok:
            first = report.errors[0]
            raise VerifyError(
                f"{wheel.name}: the earlier wheel fails the archive check: {first.line()}",
                where=where,
                next="reuse an intact release (`pinwheel check WHEEL` shows every finding)",
            )
        rec = comp.get("compiled_inputs") or {}
        for member, digest in dict(rec.get("compiled_members") or {}).items():
            info = infos.get(member)
            if info is None or hashlib.sha256(zf.read(info)).hexdigest() != digest:
                raise VerifyError(
                    f"{wheel.name}: compiled member {member!r} does not match the sha256 "
                    "provenance records for it",
                    where=where,
                    next="do not reuse this release; rebuild from source (drop --reuse-from)",
                )


# --------------------------------------------------------------------------- reuse


@dataclass(frozen=True)
class Taken:
    wheel: Path
    inputs: Mapping[str, Any]  # compiled_inputs for the new build (same files, same blobs)
    members: Mapping[str, Any]  # the reuse record for provenance


def unchanged(
    candidate: Candidate, source: Path, ident: Mapping[str, Any]
) -> tuple[bool, str, dict[str, Any] | None]:
    """(reusable, why, record): compare the recorded inputs with the new tree."""
    rec = candidate.component.get("compiled_inputs")
    if not rec:
        return False, "the earlier build recorded no compiled inputs", None
    if not rec.get("complete"):
        return False, "the earlier build's compiled inputs are incomplete", None
    if rec.get("identity") != dict(ident):
        diff = sorted(
            k for k in set(ident) | set(rec["identity"]) if ident.get(k) != rec["identity"].get(k)
        )
        return False, f"toolchain or flags changed ({', '.join(diff)})", None
    files = rec.get("files")
    if not isinstance(files, dict):
        return False, "the earlier build's compiled inputs are not a file list", None
    bad = next((p for p in files if validate.rel_path_problem(p)), None)
    if bad is not None:
        raise ReuseError(
            f"the receipt names a compiled input outside the tree: {str(bad)[:120]!r}",
            where=f"--reuse-from {redact(candidate.origin)}",
            next="reuse a release pinwheel wrote, or drop --reuse-from",
        )
    changed = [
        p
        for p, blob in files.items()
        if not (source / p).is_file() or blob_id(source / p, cap=MAX_INPUT) != blob
    ]
    added = sorted(set(build_files(source)) - set(rec["files"]))
    if changed or added:
        return False, "compiled inputs changed: " + ", ".join((changed + added)[:5]), None
    return True, f"{len(rec['files'])} compiled inputs unchanged", rec


def try_reuse(
    candidate: Candidate,
    source: Path,
    ident: Mapping[str, Any],
    dist: Path,
    *,
    python: str,
    env: Mapping[str, str],
    reporter: Reporter = SILENT,
) -> Taken | None:
    """Transplant the earlier wheel's compiled members; None (and why, logged) when not safe."""
    ok, why, rec = unchanged(candidate, source, ident)
    reporter.info(f"reuse from {candidate.wheel.name}: {'yes' if ok else 'no'}: {why}")
    if not ok or rec is None:
        return None
    wheel = transplant(candidate.wheel, rec, source, dist, python=python, env=env)
    if wheel is None:
        reporter.info("reuse: repacking failed; building from source")
        return None
    return Taken(wheel, rec, reuse_record(candidate, rec, why))


def reuse_record(candidate: Candidate, rec: Mapping[str, Any], why: str) -> dict[str, Any]:
    return {
        "from": candidate.origin,
        "wheel": candidate.wheel.name,
        "wheel_sha256": candidate.sha256,
        "tree": (candidate.component.get("source") or {}).get("tree") or rec.get("tree"),
        "why": why,
        "members": dict(rec.get("compiled_members") or {}),
    }


def transplant(
    old: Path,
    rec: Mapping[str, Any],
    source: Path,
    dist: Path,
    *,
    python: str,
    env: Mapping[str, str],
) -> Path | None:
    from_tree = set(rec.get("from_tree") or ())
    compiled = dict(rec.get("compiled_members") or {})
    with tempfile.TemporaryDirectory(prefix="pinwheel-reuse-") as tmp:
        root = Path(tmp) / "unpacked"
        root.mkdir()
        with zipfile.ZipFile(old) as zf:
            # The one archive reader: zip-slip, absolute names, links and bombs refused.
            infos = [i for i in archive.zip_members(zf, old.name) if not i.is_dir()]
            for info in infos:
                name = info.filename
                if name.endswith(".dist-info/RECORD"):
                    continue
                target = confine.inside(root, name, what="wheel member")
                confine.mkdirs(root, target.parent)
                if name in from_tree:
                    new = _tree_file(source, name)
                    if new is None:
                        continue  # deleted from the tree
                    shutil.copyfile(new, target)
                else:
                    data = zf.read(info)
                    if name in compiled and hashlib.sha256(data).hexdigest() != compiled[name]:
                        return None  # never take a member provenance does not vouch for
                    target.write_bytes(data)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    target.chmod(mode & 0o755)
        for added in _new_modules(from_tree, source):
            if validate.rel_path_problem(added):
                continue
            target = confine.inside(root, added, what="wheel member")
            confine.mkdirs(root, target.parent)
            shutil.copyfile(_tree_file(source, added) or source / added, target)
        remove_tree(dist, ignore_errors=True)
        dist.mkdir(parents=True)
        before: set[Path] = set()
        proc = runner.run(
            runner.Command(
                (python, "-m", "wheel", "pack", str(root), "-d", str(dist)),
                env=env,
                check=False,
            )
        )
        made = sorted(set(dist.glob("*.whl")) - before)
        if proc.returncode != 0 or len(made) != 1:
            return None
        return made[0]


def _new_modules(from_tree: Iterable[str], source: Path) -> list[str]:
    """Files in the new tree beside the copied ones, with their suffixes, not in the wheel yet."""
    known = set(from_tree)
    suffixes = {Path(m).suffix for m in known}
    dirs = {str(Path(m).parent) for m in known}
    out: list[str] = []
    for d in sorted(dirs):
        for base in (source / d, source / "src" / d):
            if not base.is_dir():
                continue
            for f in sorted(base.iterdir()):
                rel = f"{d}/{f.name}" if d != "." else f.name
                if f.is_file() and f.suffix in suffixes and rel not in known:
                    out.append(rel)
            break
    return out


def precompiled_env(source: Path, candidate: Candidate) -> dict[str, str] | None:
    """vLLM's own reuse: its setup.py takes the .so files from VLLM_PRECOMPILED_WHEEL_LOCATION."""
    setup = source / "setup.py"
    if setup.is_file() and "VLLM_PRECOMPILED_WHEEL_LOCATION" in setup.read_text(errors="replace"):
        return {
            "VLLM_USE_PRECOMPILED": "1",
            "VLLM_PRECOMPILED_WHEEL_LOCATION": str(candidate.wheel),
        }
    return None


__all__ = [
    "Candidate",
    "Recorder",
    "ReuseError",
    "Taken",
    "blob_id",
    "candidates",
    "identity",
    "members_of",
    "parse_depfile",
    "precompiled_env",
    "try_reuse",
    "unchanged",
]
