"""``pinwheel index``: a static package index for a release, one per variant, pip and uv accept.

The release is verified first (SHA256SUMS, its signature when signers are
configured, every wheel's METADATA and WHEEL against its file name); then a
directory is written atomically:

```
OUT/index.html                       the variants
OUT/files/WHEEL                      the wheels (hard links when on the same disk)
OUT/files/WHEEL.metadata             PEP 658: the wheel's METADATA, byte for byte
OUT/files/SHA256SUMS ...             the rest of the release as it was signed (SHA256SUMS,
                                     its .sig, the attestation, bundles, notes, pylock.toml):
                                     `pinwheel fetch BASE/files/` and `verify-release` read it
OUT/VARIANT/simple/index.html|json   PEP 503 / PEP 691 root: the projects
OUT/VARIANT/simple/NAME/index.html|json
OUT/VARIANT/requirements.txt         every wheel of the variant and every dependency of the
                                     release's pylock.toml, by version and sha256 (one line
                                     to install: pip or uv with --require-hashes)
OUT/VARIANT/pylock.toml              the same as a PEP 751 lock: the release's wheels by
                                     relative path (install from a local copy of OUT), or
                                     with --base-url BASE by absolute URL BASE/files/WHEEL
                                     (install over HTTP: `uv pip install -r BASE/VARIANT/
                                     pylock.toml`; pip >= 26.1 `pip install -r` the same)
OUT/.pinwheel-index                  marks a folder this command made (--out replaces only one)
```

A dependency the release's ``pylock.toml`` pins is listed on the variant's pages by
its own URL and sha256 (the index points to it; pip and uv check the hash), so the
index serves everything the engine needs. A dependency no lock pins is named in the
outcome (``unserved``), and the variant's requirements.txt and the outcome (``steps``)
give the commands that install it with every dependency hashed (each resolves a lock
first). Folders are 0755 and files 0644: a web server running as
another user reads them. A variant label must be a plain folder name that none of
the index's own names (``files``, ``index.html``, ...) takes.

A variant is what a wheel's PEP 440 local label names after ``pw.``
(``1.5.2+pw.v100.cu124.torch2.10`` -> ``v100.cu124.torch2.10``); a wheel with
no pinwheel label belongs to every variant; a release with no labelled wheel
has one variant, ``all``. Links carry ``#sha256=`` (the verified SHA256SUMS
value), ``data-requires-python`` (METADATA's ``Requires-Python``, escaped),
``data-dist-info-metadata`` and ``data-core-metadata`` (PEP 714 spells both)
with the metadata file's sha256. The JSON pages are PEP 691 (api-version 1.1,
PEP 700 ``versions`` and ``size``); a static server returns ``index.html``
for a directory, so serving JSON needs the server to map
``Accept: application/vnd.pypi.simple.v1+json`` to ``index.json``
(docs/release.md has the rule). Every URL is relative, so the directory can
be served from any base.

Nothing here reads the clock: the same release gives the same bytes.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.pylock import Package, PackageWheel, Pylock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from pinwheel.checksums import SIG, SUMS
from pinwheel.errors import UsageError, VerifyError
from pinwheel.fsutil import atomic_dir, atomic_write_bytes, atomic_write_text, link_or_copy
from pinwheel.printable import shown_cmd
from pinwheel.release import attest, pylock, sigstorebundle
from pinwheel.release.assemble import verify_release
from pinwheel.validate import base_url_problem
from pinwheel.wheels.metadata import read_path

FILES = "files"
ALL = "all"
REQUIREMENTS = "requirements.txt"
MARKER = ".pinwheel-index"
# names at the index root a variant folder must never take
RESERVED = frozenset({FILES, "index.html", "index.json", REQUIREMENTS, pylock.FILENAME, MARKER})
_LABEL = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
LABEL_PREFIX = "pw."
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
API = {"api-version": "1.1"}


@dataclass(frozen=True)
class IndexRequest:
    release: Path  # a release directory (SHA256SUMS, wheels)
    out: Path  # the index directory to write (replaced atomically)
    allowed_signers: Path | None = None
    principal: str | None = None
    # the URL OUT is served at (validate.base_url_problem): the variant's pylock.toml then
    # names each wheel by absolute URL; None: by path relative to the lock (a local copy)
    base_url: str | None = None


@dataclass(frozen=True)
class IndexedFile:
    filename: str
    project: str  # PEP 503 normalized
    version: str
    sha256: str
    size: int
    requires_python: str | None
    metadata_sha256: str


@dataclass(frozen=True)
class Dependency:
    """A package of the release's pylock.toml: served by its own URLs and hashes."""

    project: str  # PEP 503 normalized
    version: str
    files: tuple[tuple[str, str, str], ...]  # (file name, url, sha256)


@dataclass(frozen=True)
class IndexOutcome:
    out: Path
    variants: Mapping[str, tuple[str, ...]]  # variant -> wheel file names
    files: tuple[IndexedFile, ...]
    signed_by: str | None
    dependencies: tuple[Dependency, ...] = ()  # from the release's pylock.toml
    # Requires-Dist names no wheel of the release and no package of its lock provides
    unserved: tuple[str, ...] = field(default=())
    # variant -> the commands that install it with every dependency hashed (when unserved)
    steps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def variant_of(filename: str) -> str | None:
    """The variant a wheel's local label names (``pw.`` stripped), or None without one."""
    version = parse_wheel_filename(filename)[1]
    local = version.local or ""
    return local.removeprefix(LABEL_PREFIX) if local.startswith(LABEL_PREFIX) else None


def _file_url(filename: str) -> str:
    # project pages live at VARIANT/simple/NAME/: three levels below the index root
    return f"../../../{FILES}/{urllib.parse.quote(filename)}"


def _dependency_html(dep: Dependency) -> str:
    rows = [f'    <a href="{html.escape(url)}#sha256={sha}">{html.escape(name)}</a><br>'
            for name, url, sha in dep.files]  # fmt: skip
    return _page(dep.project, rows)


def _dependency_json(dep: Dependency) -> str:
    doc = {
        "meta": API,
        "name": dep.project,
        "versions": [dep.version],
        "files": [{"filename": n, "url": u, "hashes": {"sha256": h}, "yanked": False}
                  for n, u, h in dep.files],  # fmt: skip
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _page(project: str, rows: list[str]) -> str:
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.1">\n'
        f"    <title>Links for {html.escape(project)}</title>\n  </head>\n  <body>\n"
        f"    <h1>Links for {html.escape(project)}</h1>\n"
        + "\n".join(rows)
        + "\n  </body>\n</html>\n"
    )


def _project_html(project: str, files: list[IndexedFile]) -> str:
    rows = []
    for f in files:
        attrs = [f'href="{html.escape(_file_url(f.filename))}#sha256={f.sha256}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python)}"')
        attrs.append(f'data-dist-info-metadata="sha256={f.metadata_sha256}"')
        attrs.append(f'data-core-metadata="sha256={f.metadata_sha256}"')
        rows.append(f"    <a {' '.join(attrs)}>{html.escape(f.filename)}</a><br>")
    return _page(project, rows)


def _project_json(project: str, files: list[IndexedFile]) -> str:
    doc = {
        "meta": API,
        "name": project,
        "versions": sorted({f.version for f in files}),
        "files": [
            {
                "filename": f.filename,
                "url": _file_url(f.filename),
                "hashes": {"sha256": f.sha256},
                "requires-python": f.requires_python,
                "core-metadata": {"sha256": f.metadata_sha256},
                "dist-info-metadata": {"sha256": f.metadata_sha256},
                "size": f.size,
                "yanked": False,
            }
            for f in files
        ],
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _root_html(projects: list[str]) -> str:
    rows = "\n".join(f'    <a href="{html.escape(p)}/">{html.escape(p)}</a><br>' for p in projects)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.1">\n'
        "    <title>Simple index</title>\n  </head>\n  <body>\n" + rows + "\n  </body>\n</html>\n"
    )


def _root_json(projects: list[str]) -> str:
    doc = {"meta": API, "projects": [{"name": p} for p in projects]}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _variants_html(variants: list[str]) -> str:
    rows = "\n".join(
        f'    <li><a href="{html.escape(v)}/simple/">{html.escape(v)}</a>: '
        f"<code>--index-url BASE/{html.escape(v)}/simple/</code></li>"
        for v in variants
    )
    return (
        "<!DOCTYPE html>\n<html>\n  <head><title>Variants</title></head>\n  <body>\n"
        "    <ul>\n" + rows + "\n    </ul>\n  </body>\n</html>\n"
    )


def _check_out(request: IndexRequest) -> None:
    """--out is a folder this command made (its marker), an empty one, or new; never the
    release, nothing inside it, nothing it is inside."""
    out, release = request.out.resolve(), request.release.resolve()
    if out == release or release in out.parents or out in release.parents:
        raise UsageError(
            f"--out {request.out} is the release folder, inside it or around it",
            where="pinwheel index --out",
            next="pass a folder beside the release, e.g. "
            f"{shown_cmd('--out', f'{request.release}-index')}",
        )
    if not (os.path.lexists(request.out)):
        return
    if request.out.is_symlink() or not request.out.is_dir():
        raise UsageError(
            f"--out {request.out} exists and is not a folder", where="pinwheel index --out",
            next="pass a new folder (pinwheel index makes it)",
        )  # fmt: skip
    made = request.out / MARKER
    if any(request.out.iterdir()) and not (made.is_file() and not made.is_symlink()):
        raise UsageError(
            f"--out {request.out} is a folder pinwheel index did not make, and not empty: "
            "it would be replaced whole",
            where="pinwheel index --out",
            next="pass a new or empty folder, or remove this one yourself",
        )


def _variant_problem(variant: str) -> str | None:
    if variant in RESERVED:
        return f"the index's own name {variant!r}"
    if not _LABEL.fullmatch(variant) or len(variant) > 100:
        return f"{variant!r} is not a plain folder name (a-z, 0-9, '.', '_', '-')"
    return None


def _variants(files: list[IndexedFile], where: Path) -> list[str]:
    labelled = sorted({v for f in files if (v := variant_of(f.filename)) is not None})
    bad = [
        f"{f.filename}: {why}"
        for f in files
        if (v := variant_of(f.filename)) is not None and (why := _variant_problem(v))
    ]
    if bad:
        raise VerifyError(
            "a wheel's variant label cannot be a folder of the index; no index was written:\n"
            "    " + "\n    ".join(bad[:20]),
            where=str(where),
            next="rebuild with another label (the `+pw.LABEL` of the version: letters, digits "
            f"and dots, none of {', '.join(sorted(RESERVED))})",
        )
    return labelled or [ALL]


def _dependencies(release: Path, sums: Mapping[str, str]) -> tuple[Dependency, ...]:
    """The release's pylock.toml packages (its hash checked against SHA256SUMS)."""
    path = release / pylock.FILENAME
    if pylock.FILENAME not in sums or not path.is_file():
        return ()
    if hashlib.sha256(path.read_bytes()).hexdigest() != sums[pylock.FILENAME]:
        raise VerifyError(f"{pylock.FILENAME} differs from SHA256SUMS", where=str(path),
                          next="fetch the release from the publisher again")  # fmt: skip
    lock = pylock.check(path)
    out = []
    for name, version in lock.packages:
        files = tuple((w.name or w.url.rsplit("/", 1)[-1], w.url, w.sha256)
                      for w in lock.wheels.get(name, ()))  # fmt: skip
        if files:
            out.append(Dependency(str(canonicalize_name(name)), version, files))
    return tuple(out)


def _unserved(release: Path, files: list[IndexedFile], deps: tuple[Dependency, ...]) -> list[str]:
    """Requires-Dist names (this machine's markers, no extras) nothing here provides."""
    have = {f.project for f in files} | {d.project for d in deps}
    missing: set[str] = set()
    for f in files:
        for text in read_path(release / f.filename).requires_dist:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if canonicalize_name(req.name) not in have:
                missing.add(str(canonicalize_name(req.name)))
    return sorted(missing)


def unserved_steps(variant: str, picked: list[IndexedFile]) -> list[str]:
    """What a stranger runs instead of the requirements file when the release ships no lock:
    each command installs every dependency by hash (a resolver hashes what it takes)."""
    pins = " ".join(sorted(f"{f.project}=={f.version}" for f in picked))
    return [
        "pinwheel fetch BASE/files/ --allowed-signers allowed_signers && "
        "pinwheel install fetched-release --venv VENV --allowed-signers allowed_signers",
        f"pip lock --extra-index-url BASE/{variant}/simple/ -o pylock.toml {pins} && "
        "pip install -r pylock.toml",
    ]


def _requirements(variant: str, picked: list[IndexedFile], deps: tuple[Dependency, ...],
                  unserved: list[str]) -> str:  # fmt: skip
    lines = ["# pip install --require-hashes -r BASE/VARIANT/requirements.txt "
             "--index-url BASE/VARIANT/simple/  (or uv pip install, the same flags)"]  # fmt: skip
    if unserved:
        steps = unserved_steps(variant, picked)
        lines += [
            "# NOT ENOUGH ALONE: the release ships no pylock.toml, so these dependencies of its "
            f"wheels have no hash here: {', '.join(unserved)}; with --require-hashes pip and uv "
            "refuse them. Install instead (each resolves them into a hashed lock first):",
            f"#   {steps[0]}",
            f"#   {steps[1]}   (pip >= 26.1; the dependencies from pip's configured index)",
            "# or the publisher ships the lock: pinwheel install, runtime-lock, release --lock "
            "(docs/release.md)",
        ]
    for f in sorted(picked, key=lambda f: f.project):
        lines.append(f"{f.project}=={f.version} --hash=sha256:{f.sha256}")
    for d in deps:
        hashes = " ".join(f"--hash=sha256:{sha}" for _, _, sha in d.files)
        lines.append(f"{d.project}=={d.version} {hashes}")
    return "\n".join(lines) + "\n"


def lock_wheel(filename: str, sha256: str, base_url: str | None) -> PackageWheel:
    """One release wheel of a variant's pylock.toml: by absolute URL under ``base_url``
    (installable over HTTP), else by path relative to the lock (from a local copy of OUT:
    an installer reading the lock from a URL cannot follow a relative path)."""
    if base_url is None:
        return PackageWheel(name=filename, path=f"../{FILES}/{filename}",
                            hashes={"sha256": sha256})  # fmt: skip
    url = f"{base_url}{FILES}/{urllib.parse.quote(filename)}"
    return PackageWheel(name=filename, url=url, hashes={"sha256": sha256})


def _variant_lock(picked: list[IndexedFile], deps: tuple[Dependency, ...],
                  base_url: str | None) -> str:  # fmt: skip
    """PEP 751 (``packaging.pylock``): the release's wheels by path (or by URL under
    ``base_url``), the lock's by URL."""
    packages = [Package(name=canonicalize_name(f.project), version=Version(f.version),
                        wheels=[lock_wheel(f.filename, f.sha256, base_url)])
                for f in sorted(picked, key=lambda f: f.project)]  # fmt: skip
    packages += [Package(name=canonicalize_name(d.project), version=Version(d.version),
                         wheels=[PackageWheel(name=n, url=u, hashes={"sha256": h})
                                 for n, u, h in d.files]) for d in deps]  # fmt: skip
    return pylock.render(Pylock(lock_version=Version("1.0"), created_by="pinwheel index",
                                packages=packages))  # fmt: skip


def _carry_release(release: Path, sums: Mapping[str, str], target: Path) -> None:
    """The release's other files beside its wheels, as signed: fetch and verify-release read
    ``BASE/files/`` as a release."""
    names = [n for n in sums if not n.endswith(".whl")] + [SUMS, SIG, attest.FILENAME]
    names += [p.name for p in sigstorebundle.bundles(release)]
    for name in sorted(set(names)):
        src = release / name
        if src.is_file() and not src.is_symlink():
            shutil.copyfile(src, target / name)
            os.chmod(target / name, 0o644)


def _open_up(root: Path) -> None:
    """0755 folders, 0644 files: a web server running as another user reads the index."""
    for folder, _dirs, names in os.walk(root):
        os.chmod(folder, 0o755)
        for name in names:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), 0o644)


def build_index(request: IndexRequest) -> IndexOutcome:
    """Verify the release, then write its index directory (atomically; same input, same bytes)."""
    if request.base_url is not None and (why := base_url_problem(request.base_url)):
        raise UsageError(
            f"--base-url {request.base_url!r}: {why}",
            where="pinwheel index --base-url",
            next="pass the http(s) URL the --out folder will be served at, ending with '/' "
            "(e.g. --base-url https://example.org/release-index/), or leave it out",
        )
    _check_out(request)
    verified = verify_release(
        request.release, allowed_signers=request.allowed_signers, principal=request.principal
    )
    wheels = sorted(n for n in verified.sums if n.endswith(".whl"))
    if not wheels:
        raise VerifyError(
            f"no wheels listed in {request.release}/SHA256SUMS",
            where=str(request.release),
            next="run `pinwheel release` first",
        )
    files, metadata = _read_wheels(request.release, wheels, verified.sums)
    variants = _variants(files, request.release)
    deps = _dependencies(request.release, verified.sums)
    chosen: dict[str, list[IndexedFile]] = {
        v: [f for f in files if variant_of(f.filename) in (v, None)] for v in variants
    }
    with atomic_dir(request.out) as tmp:
        (tmp / FILES).mkdir()
        for f in files:
            link_or_copy(request.release / f.filename, tmp / FILES / f.filename)
            atomic_write_bytes(tmp / FILES / f"{f.filename}.metadata", metadata[f.filename])
        _carry_release(request.release, verified.sums, tmp / FILES)
        for variant, picked in chosen.items():
            _write_variant(tmp / variant, picked, deps, _unserved(request.release, picked, deps),
                           request.base_url)
        atomic_write_text(tmp / "index.html", _variants_html(variants))
        atomic_write_text(tmp / MARKER, "made by `pinwheel index`: --out replaces it whole\n")
        _open_up(tmp)
    return IndexOutcome(
        out=request.out,
        variants={v: tuple(f.filename for f in fs) for v, fs in chosen.items()},
        files=tuple(files),
        signed_by=verified.signed_by,
        dependencies=deps,
        unserved=tuple(_unserved(request.release, files, deps)),
        steps={v: tuple(unserved_steps(v, fs)) for v, fs in chosen.items()
               if _unserved(request.release, fs, deps)},  # fmt: skip
    )


def _write_variant(root: Path, picked: list[IndexedFile], deps: tuple[Dependency, ...],
                   unserved: list[str], base_url: str | None) -> None:  # fmt: skip
    simple = root / "simple"
    ours = {f.project for f in picked}
    served = [d for d in deps if d.project not in ours]
    projects = sorted(ours | {d.project for d in served})
    simple.mkdir(parents=True)
    atomic_write_text(simple / "index.html", _root_html(projects))
    atomic_write_text(simple / "index.json", _root_json(projects))
    for project in sorted(ours):
        mine = sorted((f for f in picked if f.project == project), key=lambda f: f.filename)
        (simple / project).mkdir()
        atomic_write_text(simple / project / "index.html", _project_html(project, mine))
        atomic_write_text(simple / project / "index.json", _project_json(project, mine))
    for dep in served:
        (simple / dep.project).mkdir()
        atomic_write_text(simple / dep.project / "index.html", _dependency_html(dep))
        atomic_write_text(simple / dep.project / "index.json", _dependency_json(dep))
    text = _requirements(root.name, picked, tuple(served), unserved)
    atomic_write_text(root / REQUIREMENTS, text)
    atomic_write_text(root / pylock.FILENAME, _variant_lock(picked, tuple(served), base_url))


def _read_wheels(
    release: Path, wheels: list[str], sums: Mapping[str, str]
) -> tuple[list[IndexedFile], dict[str, bytes]]:
    files: list[IndexedFile] = []
    metadata: dict[str, bytes] = {}
    problems: list[str] = []
    for name in wheels:
        path = release / name
        meta = read_path(path)
        if not meta.ok:
            problems += [f"{name}: {p}" for p in meta.problems]
            continue
        metadata[name] = meta.metadata
        dist, version = parse_wheel_filename(name)[:2]
        files.append(
            IndexedFile(
                filename=name,
                project=str(canonicalize_name(dist)),
                version=str(version),
                sha256=sums[name],
                size=path.stat().st_size,
                requires_python=meta.requires_python,
                metadata_sha256=hashlib.sha256(meta.metadata).hexdigest(),
            )
        )
    if problems:
        raise VerifyError(
            "wheel metadata disagrees with the file name; no index was written:\n    "
            + "\n    ".join(problems[:20]),
            where=str(release),
            next="rebuild the wheels (`pinwheel check WHEEL` shows the same findings)",
        )
    return files, metadata
