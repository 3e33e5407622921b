"""``pinwheel index``: a static package index for a release, one per variant, pip and uv accept.

The release is verified first (SHA256SUMS, its signature when signers are
configured, every wheel's METADATA and WHEEL against its file name); then a
directory is written atomically:

```
OUT/index.html                       the variants
OUT/files/WHEEL                      the wheels (hard links when on the same disk)
OUT/files/WHEEL.metadata             PEP 658: the wheel's METADATA, byte for byte
OUT/VARIANT/simple/index.html|json   PEP 503 / PEP 691 root: the projects
OUT/VARIANT/simple/NAME/index.html|json
```

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
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from pinwheel.errors import VerifyError
from pinwheel.fsutil import atomic_dir, atomic_write_bytes, atomic_write_text, link_or_copy
from pinwheel.release.assemble import verify_release
from pinwheel.wheels.metadata import read_path

FILES = "files"
ALL = "all"
LABEL_PREFIX = "pw."
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
API = {"api-version": "1.1"}


@dataclass(frozen=True)
class IndexRequest:
    release: Path  # a release directory (SHA256SUMS, wheels)
    out: Path  # the index directory to write (replaced atomically)
    allowed_signers: Path | None = None
    principal: str | None = None


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
class IndexOutcome:
    out: Path
    variants: Mapping[str, tuple[str, ...]]  # variant -> wheel file names
    files: tuple[IndexedFile, ...]
    signed_by: str | None


def variant_of(filename: str) -> str | None:
    """The variant a wheel's local label names (``pw.`` stripped), or None without one."""
    version = parse_wheel_filename(filename)[1]
    local = version.local or ""
    return local.removeprefix(LABEL_PREFIX) if local.startswith(LABEL_PREFIX) else None


def _file_url(filename: str) -> str:
    # project pages live at VARIANT/simple/NAME/: three levels below the index root
    return f"../../../{FILES}/{urllib.parse.quote(filename)}"


def _project_html(project: str, files: list[IndexedFile]) -> str:
    rows = []
    for f in files:
        attrs = [f'href="{html.escape(_file_url(f.filename))}#sha256={f.sha256}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python)}"')
        attrs.append(f'data-dist-info-metadata="sha256={f.metadata_sha256}"')
        attrs.append(f'data-core-metadata="sha256={f.metadata_sha256}"')
        rows.append(f"    <a {' '.join(attrs)}>{html.escape(f.filename)}</a><br>")
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.1">\n'
        f"    <title>Links for {html.escape(project)}</title>\n  </head>\n  <body>\n"
        f"    <h1>Links for {html.escape(project)}</h1>\n"
        + "\n".join(rows)
        + "\n  </body>\n</html>\n"
    )


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


def build_index(request: IndexRequest) -> IndexOutcome:
    """Verify the release, then write its index directory (atomically; same input, same bytes)."""
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
    files: list[IndexedFile] = []
    metadata: dict[str, bytes] = {}
    problems: list[str] = []
    for name in wheels:
        path = request.release / name
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
                sha256=verified.sums[name],
                size=path.stat().st_size,
                requires_python=meta.requires_python,
                metadata_sha256=hashlib.sha256(meta.metadata).hexdigest(),
            )
        )
    if problems:
        raise VerifyError(
            "wheel metadata disagrees with the file name; no index was written:\n    "
            + "\n    ".join(problems[:20]),
            where=str(request.release),
            next="rebuild the wheels (`pinwheel check WHEEL` shows the same findings)",
        )
    labelled = sorted({v for f in files if (v := variant_of(f.filename)) is not None})
    variants = labelled or [ALL]
    chosen: dict[str, list[IndexedFile]] = {
        v: [f for f in files if variant_of(f.filename) in (v, None)] for v in variants
    }
    with atomic_dir(request.out) as tmp:
        (tmp / FILES).mkdir()
        for f in files:
            link_or_copy(request.release / f.filename, tmp / FILES / f.filename)
            atomic_write_bytes(tmp / FILES / f"{f.filename}.metadata", metadata[f.filename])
        for variant, picked in chosen.items():
            simple = tmp / variant / "simple"
            projects = sorted({f.project for f in picked})
            simple.mkdir(parents=True)
            atomic_write_text(simple / "index.html", _root_html(projects))
            atomic_write_text(simple / "index.json", _root_json(projects))
            for project in projects:
                mine = sorted((f for f in picked if f.project == project), key=lambda f: f.filename)
                (simple / project).mkdir()
                atomic_write_text(simple / project / "index.html", _project_html(project, mine))
                atomic_write_text(simple / project / "index.json", _project_json(project, mine))
        atomic_write_text(tmp / "index.html", _variants_html(variants))
    return IndexOutcome(
        out=request.out,
        variants={v: tuple(f.filename for f in fs) for v, fs in chosen.items()},
        files=tuple(files),
        signed_by=verified.signed_by,
    )
