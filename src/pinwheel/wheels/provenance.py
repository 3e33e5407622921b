"""The provenance receipt (``provenance.json``, schema ``pinwheel.provenance/1``).

It says exactly what went into the wheels beside it: the manifest (by sha256),
the upstream base, every replayed step with its PR head and replayed commits,
the tree, the toolchain versions, arches, the build environment pinwheel set,
each wheel's sha256, and facts about the build host. ``pinwheel verify-build``
reads it back to rebuild the same thing.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pinwheel import documents, runner
from pinwheel.errors import PinwheelError, VerifyError
from pinwheel.fsutil import atomic_write_text
from pinwheel.urls import redact, redact_tree

SCHEMA = "pinwheel.provenance/1"
FILENAME = "provenance.json"


@dataclass(frozen=True)
class ToolchainFacts:
    cuda: str | None  # "12.4.131"
    nvcc: str | None  # the nvcc --version release line
    gcc: str | None  # first line of gcc --version
    torch: str | None  # torch.__version__ in the build interpreter, if installed
    python: str  # "3.11.7"


def _first_line(cmd: list[str], pattern: str | None = None) -> str | None:
    try:
        out = runner.run(runner.Command(tuple(cmd), timeout=120, check=False))
    except PinwheelError:  # not there, or hung
        return None
    if out.returncode != 0:
        return None
    lines = [ln.strip() for ln in out.text.splitlines() if ln.strip()]
    if pattern:
        lines = [ln for ln in lines if re.search(pattern, ln)]
    return lines[0] if lines else None


def toolchain_facts(
    python: str, nvcc: Path | None, cuda: str | None, cxx: str | None
) -> ToolchainFacts:
    """Versions as the build saw them: ask each tool, never assume (``cxx``: the build's C++
    compiler, CXX as the toolchain choice set it; None: ``g++``)."""
    # torch's version from its distribution metadata (what torch.__version__ says, for
    # PyPI's and source builds alike): importing torch to ask cost seconds on every build,
    # a no-change one included.
    probe = (
        "import platform, importlib.metadata as m; v = platform.python_version()\n"
        "try:\n"
        "    t = m.version('torch')\n"
        "except m.PackageNotFoundError:\n"
        "    t = None\n"
        "print(v); print(t or '')"
    )
    out = runner.run(
        runner.Command((python, "-c", probe), what="the build python", timeout=300, check=False)
    )
    lines = out.stdout.decode(errors="replace").splitlines() if out.returncode == 0 else []
    py = lines[0] if lines else platform.python_version()
    torch = lines[1] if len(lines) > 1 and lines[1] else None
    return ToolchainFacts(
        cuda=cuda,
        nvcc=_first_line([str(nvcc), "--version"], r"release") if nvcc else None,
        gcc=_first_line([cxx or "g++", "--version"]),  # the build's C++ compiler
        torch=torch,
        python=py,
    )


def member_digests(wheel: Path) -> dict[str, str]:
    """Each member of ``wheel`` (one pinwheel just built and checked) with its sha256: two
    builders see which member differs without exchanging wheels."""
    import hashlib
    import zipfile

    out: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            h = hashlib.sha256()
            with zf.open(info) as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            out[info.filename] = h.hexdigest()
    return dict(sorted(out.items()))


def environment_differences(
    recorded: Mapping[str, Any] | None, rebuilt: Mapping[str, Any] | None
) -> list[str]:
    """How two builds' environments (a component's ``environment``) differ: the lock, then each
    package by name (version, RECORD sha256, lock or machine)."""
    if not recorded and not rebuilt:
        return []
    if not recorded or not rebuilt:
        return ["one build records no build environment"]
    out = []
    for key in ("lock", "lock_sha256"):
        if recorded.get(key) != rebuilt.get(key):
            out.append(f"{key}: {recorded.get(key)} -> {rebuilt.get(key)}")

    def by_name(env: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
        return {
            str(p.get("name")): (p.get("version"), p.get("record_sha256"), p.get("from"))
            for p in env.get("packages") or [] if isinstance(p, Mapping) and not p.get("shadowed")
        }  # fmt: skip

    a, b = by_name(recorded), by_name(rebuilt)
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            old, new = a.get(name), b.get(name)
            out.append(f"{name}: {old[0] if old else 'absent'} -> {new[0] if new else 'absent'}"
                       + (" (other files)" if old and new and old[0] == new[0] else ""))
    return out


def member_differences(
    recorded: Mapping[str, str] | None, rebuilt: Mapping[str, str] | None
) -> list[tuple[str, str]]:
    """(member, change) from two builds' published member digests, no wheel needed."""
    a, b = dict(recorded or {}), dict(rebuilt or {})
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in b:
            out.append((name, "only in recorded"))
        elif name not in a:
            out.append((name, "only in rebuilt"))
        elif a[name] != b[name]:
            out.append((name, "differs"))
    return out


def pinwheel_environment(lock: Path | None, lock_name: str | None) -> dict[str, Any]:
    """pinwheel's own environment as the build ran it: the lock it was installed from (name
    and sha256; None for a copy installed without one), whether the running packages are
    the lock's, and the git library whose merges decide the replayed commits."""
    import importlib.metadata as md

    import pygit2

    facts: dict[str, Any] = {
        "lock": lock_name,
        "lock_sha256": None,
        "differs": None,
        "pygit2": getattr(pygit2, "__version__", None),
        "libgit2": getattr(pygit2, "LIBGIT2_VERSION", None),
    }
    if lock is None or not lock.is_file():
        return facts
    import hashlib

    text = lock.read_text()
    facts["lock_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    differs = []
    for line in text.replace("\\\n", " ").splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(?:\s*;\s*([^\\#]+?))?\s*(?:--|$)",
                     line.strip())
        if not m:
            continue
        name, version, marker = m.group(1), m.group(2), m.group(3)
        if marker:
            from packaging.markers import Marker

            if not Marker(marker.strip()).evaluate():
                continue
        try:
            got = md.version(name)
        except md.PackageNotFoundError:
            differs.append(f"{name}=={version} not installed")
            continue
        if got != version:
            differs.append(f"{name} {got}, the lock says {version}")
    facts["differs"] = differs
    return facts


def host_facts() -> dict[str, Any]:
    """What about the build machine could change the output (no host name, no user)."""
    facts: dict[str, Any] = {
        "system": platform.system(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "libc": "-".join(x for x in platform.libc_ver() if x) or None,
        "cpus": os.cpu_count(),
    }
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        facts["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        facts["memory_gib"] = None
    try:
        release = Path("/etc/os-release").read_text()
        m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', release, re.M)
        facts["os"] = m.group(1) if m else None
    except OSError:
        facts["os"] = None
    return facts


def _steps(replayed: Any) -> list[dict[str, Any]]:
    return [
        {
            "number": s.step.number,
            "action": s.step.action,
            "pr": s.step.pr,
            "head": s.pr_head,
            "patch": s.step.patch.name if s.step.patch else None,
            "result_head": s.head,
            "result_tree": s.tree,
            "commits": [
                {
                    "original": c.original,
                    "replayed": c.replayed,
                    "author": f"{c.author} <{c.author_email}>",
                    "subject": c.subject,
                }
                for c in s.commits
            ],
        }
        for s in replayed.steps
    ]


def receipt(
    manifest: Any,
    replayed: Any | None,
    *,
    toolchain: ToolchainFacts,
    arches: list[str],
    host: Mapping[str, Any] | None = None,
    pinwheel_env: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The receipt of a wheel set, minus what :func:`pinwheel.wheels.wheelset.publish` adds
    (``wheels``, ``built``, ``components`` and the engine's ``version`` and
    ``source_date_epoch``). ``replayed`` is a ``ReplayResult`` (None when the engine
    was not replayed by this run: steps are then the manifest's)."""
    if replayed is not None:
        base, head, tree, tag = replayed.base, replayed.head, replayed.tree, replayed.tag
        steps = _steps(replayed)
    else:
        # nothing replayed: the manifest's pins, labelled as such ("replayed": false); no
        # tag, which names a replayed stack
        base, head, tree, tag = manifest.upstream.commit, None, None, None
        steps = [
            {
                "number": s.number,
                "action": s.action,
                "pr": s.pr,
                "head": s.head,
                "patch": s.patch.name if s.patch else None,
                "commits": [],
            }
            for s in manifest.steps
        ]
    return {
        "schema": SCHEMA,
        "manifest": {"name": manifest.name, "path": manifest.path.name, "sha256": manifest.sha256},
        "upstream": {
            "url": redact(manifest.upstream.url),
            "branch": manifest.upstream.branch,
            "base": base,
        },
        "steps": steps,
        "replayed": replayed is not None,
        "head": head,
        "tree": tree,
        "tag": tag,
        "toolchain": asdict(toolchain),
        "arches": arches,
        "host": dict(host if host is not None else host_facts()),
        **({"pinwheel": dict(pinwheel_env)} if pinwheel_env is not None else {}),
    }


def component(payload: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The ``components`` entry called ``name`` (``"engine"`` for the engine wheel)."""
    for entry in payload.get("components") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def write_receipt(out_dir: Path, payload: Mapping[str, Any]) -> Path:
    """Write ``provenance.json`` atomically beside the wheels and SHA256SUMS."""
    target = Path(out_dir) / FILENAME
    # Credentials in any URL (a build source's https://user:token@...) never reach a receipt.
    safe = redact_tree(payload)
    atomic_write_text(target, json.dumps(safe, indent=2, sort_keys=True) + "\n")
    return target


@dataclass(frozen=True)
class Receipt(Mapping[str, Any]):
    """A read ``provenance.json``: the checked fields typed (``doc``: head, tree, tag,
    manifest, components, wheels ...), and, as a read-only mapping, every key as written
    (the build environment, substitutions, compiled inputs that release notes, reuse and
    ``check`` copy through)."""

    path: Path
    doc: documents.ProvenanceDoc
    raw: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    @property
    def head(self) -> str | None:
        return self.doc.head

    @property
    def tree(self) -> str | None:
        return self.doc.tree

    @property
    def tag(self) -> str | None:
        return self.doc.tag

    @property
    def manifest_sha256(self) -> str | None:
        return self.doc.manifest.sha256 if self.doc.manifest else None

    @property
    def components(self) -> tuple[documents.ComponentRecord, ...]:
        return tuple(self.doc.components)

    @property
    def wheels(self) -> Mapping[str, str]:
        """Wheel file name -> sha256, as recorded."""
        return self.doc.wheels or {c.wheel: c.sha256 for c in self.doc.components}

    def component(self, name: str) -> dict[str, Any] | None:
        """The ``components`` entry called ``name``, every key as written."""
        return component(self.raw, name)

    def entries(self) -> list[dict[str, Any]]:
        """Every ``components`` entry, every key as written (checked: see ``components``)."""
        return [c for c in self.raw.get("components") or [] if isinstance(c, dict)]


def read_receipt(path: Path) -> Receipt:
    """The receipt at ``path``, bounded and checked field by field (:mod:`pinwheel.untrusted`):
    a receipt from another machine or a damaged file is an error naming the field."""
    path = Path(path)
    if not path.exists():
        raise VerifyError(
            f"no {FILENAME} in {path.parent}",
            where=str(path),
            next="build first (`tools/replay build`), or pass --wheels DIR of a finished build",
        )
    doc, raw = documents.read_provenance(path, SCHEMA)
    return Receipt(path, doc, raw)
