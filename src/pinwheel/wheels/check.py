"""The artifact check: does each wheel really carry what a V100 owner needs, and nothing unsafe?

For every wheel: each CUDA shared object carries SASS (machine code) for every
requested arch, and PTX where the arch asks for it (``7.0+PTX``), read from the
ELF ``.nv_fatbin`` section in pure Python (:mod:`pinwheel.fatbin`) so the
check needs no NVIDIA tools; cuobjdump, when given, must agree. Required
members are present; no ELF member has an RPATH/RUNPATH into a build, temp or
home directory; no member is absolute, escapes with ``..``, or is a symlink;
RECORD hashes match; the wheel's glibc floor (the highest GLIBC_/GLIBCXX_/CXXABI_
symbol version any ELF member needs, :mod:`pinwheel.wheels.abifloor`) is reported and
gated by ``[build] max_glibc``; ``auditwheel show`` runs when installed.

Everything found is collected into a frozen :class:`CheckReport`; a caller
decides to raise (:meth:`CheckReport.raise_if_failed`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import struct
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.utils import canonicalize_name

from pinwheel import runner
from pinwheel.checksums import sha256_file
from pinwheel.cudaarch import CudaArch, names
from pinwheel.errors import PinwheelError, UsageError, VerifyError
from pinwheel.wheels import abifloor, elf, fatbin
from pinwheel.wheels.metadata import read_meta
from pinwheel.wheels.wheelfile import Limits, audit, dist_name

ERROR, WARNING = "error", "warning"
_HOME = ("/home/", "/root/", "/Users/")
_TEMP = ("/tmp/", "/var/tmp/", "/dev/shm/")
_BUILDISH = re.compile(r"^(build|_build|cmake-build.*|pip-.*|\.cache|\.eggs|bdist\..*|temp\..*)$")
_SM = re.compile(r"\bsm_(\d+)")
_PLATFORM_TAG = re.compile(r'consistent\s+with\s+the\s+following\s+platform\s+tag:\s+"([^"]+)"')


@dataclass(frozen=True)
class CheckSpec:
    """What the wheels must satisfy. Tools are resolved once by the caller (:func:`find_tools`)."""

    arches: tuple[CudaArch, ...]
    required_members: tuple[str, ...] = ()  # fnmatch patterns; "dist:pattern" binds one wheel
    build_dirs: tuple[str, ...] = ()  # extra RPATH prefixes that must not appear
    require_cuda: bool = True  # a wheel with no CUDA shared object fails
    cuobjdump: str | None = None
    auditwheel: str | None = None
    limits: Limits = field(default_factory=Limits)  # zip-bomb limits (pinwheel.wheelfile)
    max_glibc: abifloor.Version | None = None  # [build] max_glibc: the oldest target glibc
    glibc_limit: str = "[build] max_glibc"  # what max_glibc stands for, in the message


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning"
    rule: (
        str  # sass | ptx | cuda | fatbin | cuobjdump | rpath | zip | record | metadata | required
        # | auditwheel
    )
    wheel: str
    member: str | None
    message: str

    def line(self) -> str:
        where = f"{self.wheel}: {self.member}" if self.member else self.wheel
        return f"{self.severity}: {where}: {self.message}"


@dataclass(frozen=True)
class SharedObject:
    member: str
    sass: tuple[int, ...]
    ptx: tuple[int, ...]
    fatbins: int
    compressed: bool
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    cuobjdump_sass: tuple[int, ...] | None = None
    cuobjdump_ptx: tuple[int, ...] | None = None
    needs: tuple[elf.VersionNeed, ...] = ()  # versioned symbol requirements (GLIBC_2.34...)

    @property
    def is_cuda(self) -> bool:
        return self.fatbins > 0


@dataclass(frozen=True)
class WheelCheck:
    wheel: str  # file name
    path: str
    sha256: str
    members: int
    shared_objects: tuple[SharedObject, ...]
    auditwheel: str | None = None  # `auditwheel show` output, when it ran
    floor: abifloor.Floor = field(default_factory=abifloor.Floor)  # glibc/libstdc++ floor


@dataclass(frozen=True)
class CheckReport:
    arches: tuple[CudaArch, ...]
    wheels: tuple[WheelCheck, ...]
    findings: tuple[Finding, ...]
    tools: tuple[tuple[str, str], ...] = field(default=())

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == ERROR)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "arches": [str(a) for a in self.arches],
            "tools": dict(self.tools),
            "wheels": [
                {
                    "wheel": w.wheel,
                    "sha256": w.sha256,
                    "members": w.members,
                    "auditwheel": w.auditwheel,
                    "floor": w.floor.to_json(),
                    "shared_objects": [
                        {
                            "member": s.member,
                            "sass": [f"sm_{a}" for a in s.sass],
                            "ptx": [f"compute_{a}" for a in s.ptx],
                            "fatbins": s.fatbins,
                            "compressed": s.compressed,
                            "needed": list(s.needed),
                            "rpath": list(s.rpath),
                            "runpath": list(s.runpath),
                            "cuobjdump_sass": None
                            if s.cuobjdump_sass is None
                            else [f"sm_{a}" for a in s.cuobjdump_sass],
                        }
                        for s in w.shared_objects
                    ],
                }
                for w in self.wheels
            ],
            "findings": [
                {
                    "severity": f.severity,
                    "rule": f.rule,
                    "wheel": f.wheel,
                    "member": f.member,
                    "message": f.message,
                }
                for f in self.findings
            ],
        }

    def human_lines(self) -> list[str]:
        lines = [f"arches: {', '.join(str(a) for a in self.arches) or 'none'}"]
        lines += [f"{name}: {version}" for name, version in self.tools]
        for w in self.wheels:
            cuda = [s for s in w.shared_objects if s.is_cuda]
            lines.append(
                f"{w.wheel}  sha256 {w.sha256[:16]}…  {w.members} members, "
                f"{len(cuda)} CUDA shared object(s)"
            )
            for s in cuda:
                lines.append(
                    f"  {s.member}: SASS {names(s.sass)}; PTX "
                    f"{', '.join(f'compute_{a}' for a in s.ptx) or 'none'}"
                    f" ({s.fatbins} fatbin(s){', compressed' if s.compressed else ''})"
                )
                if s.cuobjdump_sass is not None:
                    lines.append(f"    cuobjdump agrees: SASS {names(s.cuobjdump_sass)}")
            if w.shared_objects:
                lines.append(f"  floor: {w.floor.summary()}")
                lines.extend(f"    {r.describe()}" for r in w.floor.requirements)
            if w.auditwheel is not None:
                tag = _PLATFORM_TAG.search(w.auditwheel)
                lines.append(f"  auditwheel show: {tag.group(1) if tag else w.auditwheel[:120]}")
        lines.extend(f.line() for f in self.findings)
        n_err, n_warn = len(self.errors), len(self.findings) - len(self.errors)
        verdict = "PASS" if self.ok else "FAIL"
        lines.append(
            f"{verdict}: {len(self.wheels)} wheel(s), {n_err} error(s), {n_warn} warning(s)"
        )
        if not self.ok:
            lines.append(f"  next: {self.next_step()}")
        return lines

    def next_step(self) -> str:
        """What to do about the errors: a damaged archive is not an arch problem."""
        if any(f.rule in ("zip", "record") for f in self.errors):
            return (
                "do not install or release these wheels: rebuild them (`tools/replay build`) "
                "or fetch them again (`pinwheel fetch`), then rerun `pinwheel check WHEEL...`"
            )
        if self.errors and all(f.rule == "glibc" for f in self.errors):
            return (
                "build on a machine (or with a sysroot) whose glibc is not newer than "
                "[build] max_glibc (docs/build.md, 'The glibc floor'), or raise max_glibc "
                "if every target machine has that glibc; then rerun `pinwheel check WHEEL...`"
            )
        if self.errors and all(f.rule == "required" for f in self.errors):
            return (
                "the engine wheel lacks a member [build] required_members names: check the "
                "engine build's log (`tools/replay build`), or fix required_members in the "
                "manifest if the member was renamed"
            )
        return (
            "rebuild with the manifest's [build] arches (TORCH_CUDA_ARCH_LIST) and "
            "rerun `pinwheel check WHEEL...`"
        )

    def raise_if_failed(self) -> None:
        if self.ok:
            return
        shown = "\n    ".join(f.line() for f in self.errors[:20])
        more = f"\n    … and {len(self.errors) - 20} more" if len(self.errors) > 20 else ""
        raise VerifyError(
            f"artifact check failed ({len(self.errors)} error(s)):\n    {shown}{more}",
            where=", ".join(w.wheel for w in self.wheels),
            next=self.next_step(),
        )


# --------------------------------------------------------------------------- tools


def find_tools(cuda_home: str | Path | None = None) -> tuple[str | None, str | None]:
    """(cuobjdump, auditwheel) paths: cuobjdump from ``cuda_home/bin`` first, then PATH."""
    cuobjdump = None
    if cuda_home:
        candidate = Path(cuda_home) / "bin" / "cuobjdump"
        cuobjdump = str(candidate) if os.access(candidate, os.X_OK) else None
    beside = Path(sys.executable).parent / "auditwheel"  # same venv, even if not on PATH
    auditwheel = str(beside) if os.access(beside, os.X_OK) else shutil.which("auditwheel")
    return cuobjdump or shutil.which("cuobjdump"), auditwheel


def _tool_version(tool: str) -> str:
    try:
        out = runner.run(runner.Command((tool, "--version"), timeout=60, check=False))
    except PinwheelError as exc:
        return f"{tool} (unrunnable: {exc.what})"
    text = (out.text + "\n" + out.err_text).strip().splitlines()
    release = next((ln.strip() for ln in text if "release" in ln.lower()), text[0] if text else "")
    return f"{tool} ({release})"


# --------------------------------------------------------------------------- rules


def unsafe_rpath_reason(
    entry: str, build_dirs: Sequence[str] = (), member: str | None = None
) -> str | None:
    """Why an RPATH/RUNPATH entry would make the installed library load from the build machine,
    or (``$ORIGIN`` entries of ``member``) from outside the folder the wheel installs into."""
    if entry.startswith(("$ORIGIN", "${ORIGIN}")):
        return _origin_reason(entry, member) if member is not None else None
    if not entry.startswith("/"):
        return "relative path resolves against the process's working directory"
    for prefix in build_dirs:
        prefix = prefix.rstrip("/")
        if entry == prefix or entry.startswith(prefix + "/"):
            return f"inside the build directory {prefix}"
    probe = entry.rstrip("/") + "/"
    if probe.startswith(_HOME) or probe == "/root/":
        return "inside a home directory"
    if probe.startswith(_TEMP):
        return "inside a temporary directory"
    for part in PurePosixPath(entry).parts[1:]:
        if _BUILDISH.match(part):
            return f"looks like a build directory (component {part!r})"
    return None


def _origin_reason(entry: str, member: str) -> str | None:
    """An ``$ORIGIN`` entry that climbs above the install root (site-packages, or a
    ``.data`` scheme's folder): the library would load whatever lies there on the machine."""
    rest = entry.split("}", 1)[1] if entry.startswith("${") else entry[len("$ORIGIN") :]
    parts = [p for p in member.split("/")[:-1] if p not in ("", ".")]
    if parts and parts[0].endswith(".data") and len(parts) >= 2:
        parts = parts[2:]  # <name>.data/<scheme>/...: the scheme's folder is the root
    depth = len(parts)
    for part in rest.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return "climbs out of the folder the wheel installs into"
        elif part not in ("", "."):
            depth += 1
    return None


def _arch_findings(wheel: str, so: SharedObject, arches: Sequence[CudaArch]) -> list[Finding]:
    found: list[Finding] = []
    have_sass, have_ptx = set(so.sass), set(so.ptx)
    for arch in arches:
        if arch.sm not in have_sass:
            found.append(
                Finding(
                    ERROR,
                    "sass",
                    wheel,
                    so.member,
                    f"no SASS for {arch.name}: found {names(have_sass)}, need {arch.name}"
                    + (f" (PTX only: compute_{arch.sm})" if arch.sm in have_ptx else ""),
                )
            )
        if arch.ptx and not any(p <= arch.sm for p in have_ptx):
            found.append(
                Finding(
                    ERROR,
                    "ptx",
                    wheel,
                    so.member,
                    f"no PTX for compute_{arch.sm} or older: found "
                    f"{', '.join(f'compute_{p}' for p in sorted(have_ptx)) or 'none'}",
                )
            )
    return found


def _engine_in_set(
    paths: Sequence[Path], listing: Sequence[tuple[str, list[str]]], spec: CheckSpec
) -> bool:
    """Whether the set holds the engine wheel: the build's receipt beside the wheels
    names it; without one, a wheel that has the required members' top-level package."""
    import json

    listed: dict[str, str] = {}  # wheel -> kind, as the build's receipts record it
    for receipt in {p.parent / "provenance.json" for p in paths}:
        try:
            payload = json.loads(receipt.read_text())
        except (OSError, ValueError):
            continue
        components = payload.get("components") if isinstance(payload, dict) else None
        for c in components if isinstance(components, list) else ():
            if isinstance(c, dict) and isinstance(c.get("wheel"), str):
                listed[c["wheel"]] = str(c.get("kind"))
    names = {p.name for p in paths}
    if any(listed.get(n) == "engine" for n in names):
        return True
    tops = set()
    for pattern in spec.required_members:
        glob = pattern.partition(":")[2] or pattern
        top = glob.split("/", 1)[0]
        if "/" not in glob or any(ch in top for ch in "*?["):
            return True  # no package to recognise the engine by: check as written
        tops.add(top + "/")
    return any(
        name.startswith(tuple(tops))
        for wheel, members in listing
        if wheel not in listed
        for name in members
    )


def _required_findings(
    wheels: Sequence[tuple[str, list[str]]], patterns: Sequence[str]
) -> list[Finding]:
    found: list[Finding] = []
    for pattern in patterns:
        dist, sep, glob = pattern.partition(":")
        if not sep:
            dist, glob = "", pattern
        pool = [(w, m) for w, m in wheels if not dist or dist_name(w) == canonicalize_name(dist)]
        if any(fnmatch.fnmatchcase(name, glob) for _, members in pool for name in members):
            continue
        where = ", ".join(w for w, _ in pool) or f"(no wheel of distribution {dist!r})"
        found.append(
            Finding(
                ERROR,
                "required",
                where,
                None,
                f"required member {glob!r} is missing from the engine wheel "
                "(from [build] required_members)",
            )
        )
    return found


# --------------------------------------------------------------------------- per wheel


def _inspect_elf(member: str, data: elf.Reader) -> tuple[SharedObject | None, str | None]:
    try:
        image = elf.parse(data)
        dyn = elf.dynamic(image, data)
        needs = elf.version_needs(image, data)
        abifloor.requirements(member, needs)  # a version name that is no version: here
    except (elf.ElfError, ValueError) as exc:  # ElfError is a ValueError too
        return None, f"cannot read ELF: {exc}"
    sass: set[int] = set()
    ptx: set[int] = set()
    count, compressed, problem = 0, False, None
    sections = [s for s in image.sections if s.name in fatbin.SECTIONS]
    for section in sections:
        if section.type == elf.SHT_NOBITS:
            continue
        try:
            blobs = fatbin.parse_section(data, section.offset, section.size)
        except fatbin.FatbinError as exc:
            problem = f"section {section.name}: {exc}"
            continue
        count += len(blobs)
        for blob in blobs:
            sass |= blob.sass
            ptx |= blob.ptx
            compressed = compressed or any(e.compressed for e in blob.entries)
    if not sections and image.section(".nvFatBinSegment") is not None:
        problem = "has a .nvFatBinSegment wrapper but no .nv_fatbin section"
    return SharedObject(
        member=member,
        sass=tuple(sorted(sass)),
        ptx=tuple(sorted(ptx)),
        fatbins=count,
        compressed=compressed,
        needed=dyn.needed,
        rpath=dyn.rpath,
        runpath=dyn.runpath,
        needs=needs,
    ), problem


def _cuobjdump_arches(tool: str, path: Path, flag: str) -> tuple[int, ...] | str:
    # path is a temp file (absolute, never an option); cuobjdump takes no "--".
    try:
        out = runner.run(
            runner.Command((tool, flag, str(path.resolve())), timeout=600, check=False)
        )
    except PinwheelError as exc:  # could not start, or ran past the timeout
        return exc.what
    text = out.text + "\n" + out.err_text
    if out.returncode != 0:
        # No fatbin at all is not an error to us; cuobjdump says so with rc 255.
        if "does not contain device code" in text:
            return ()
        return text.strip().splitlines()[-1] if text.strip() else f"exit {out.returncode}"
    return tuple(sorted({int(m) for m in _SM.findall(out.text)}))


def _with_cuobjdump(
    wheel: str, so: SharedObject, path: Path, tool: str
) -> tuple[SharedObject, list[Finding]]:
    sass = _cuobjdump_arches(tool, path, "--list-elf")
    ptx = _cuobjdump_arches(tool, path, "--list-ptx")
    if isinstance(sass, str) or isinstance(ptx, str):
        msg = sass if isinstance(sass, str) else ptx
        return so, [
            Finding(
                WARNING,
                "cuobjdump",
                wheel,
                so.member,
                f"cuobjdump could not list device code ({msg}); "
                "the built-in fatbin reader's result stands",
            )
        ]
    updated = SharedObject(**{**so.__dict__, "cuobjdump_sass": sass, "cuobjdump_ptx": ptx})
    if set(sass) != set(so.sass) or set(ptx) != set(so.ptx):
        return updated, [
            Finding(
                ERROR,
                "cuobjdump",
                wheel,
                so.member,
                f"cuobjdump sees SASS {names(sass)} / PTX {list(ptx)}, the fatbin reader "
                f"SASS {names(so.sass)} / PTX {list(so.ptx)}",
            )
        ]
    return updated, []


def _auditwheel(tool: str, wheel: Path) -> tuple[str, Finding | None]:
    try:
        out = runner.run(
            runner.Command((tool, "show", str(wheel.resolve())), timeout=600, check=False)
        )
    except PinwheelError as exc:  # could not start, or ran past the timeout
        return exc.what, Finding(WARNING, "auditwheel", wheel.name, None, exc.what)
    text = (out.text + "\n" + out.err_text).strip()
    if out.returncode != 0:
        last = text.splitlines()[-1] if text else f"exit {out.returncode}"
        return text, Finding(WARNING, "auditwheel", wheel.name, None, f"auditwheel show: {last}")
    return text, None


# What zipfile raises on a file that is not a readable zip (a truncated or crafted one).
_OPEN_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    ValueError,
    EOFError,
    struct.error,
    UnicodeDecodeError,
)


def check_wheel(path: Path, spec: CheckSpec) -> tuple[WheelCheck, list[Finding], list[str]]:
    """One wheel: (summary, findings, member names) — required members are checked across wheels.

    Members are streamed once (bounded memory); native ones are spooled to a temp file
    and their ELF headers read from there with ``pread``.
    """
    name = path.name
    findings: list[Finding] = []
    try:
        zf = zipfile.ZipFile(path)
    except _OPEN_ERRORS as exc:
        raise VerifyError(
            f"not a readable wheel: {exc}",
            where=str(path),
            next="rebuild the wheel or re-download it",
        ) from None
    shared: list[SharedObject] = []
    with zf, tempfile.TemporaryDirectory(prefix="pinwheel-check-") as tmp:
        found = audit(
            zf,
            spec.limits,
            spool=lambda info: not info.is_dir() and _looks_native(info.filename),
            spool_dir=Path(tmp),
        )
        findings.extend(Finding(ERROR, i.rule, name, i.member, i.message) for i in found.issues)
        members = found.members
        if not any(i.rule == "zip" for i in found.issues):
            # METADATA and WHEEL against the file name (a retag or relabel must keep all three)
            described = read_meta(zf, name)
            findings.extend(Finding(ERROR, "metadata", name, None, p) for p in described.problems)
        for member, spooled in found.spooled.items():
            with open(spooled, "rb") as fh:
                reader = elf.FileReader(fh)
                if reader.read_at(0, 4) != elf.ELF_MAGIC:
                    continue
                so, problem = _inspect_elf(member, reader)
            if problem:
                findings.append(Finding(ERROR, "fatbin", name, member, problem))
            if so is None:
                continue
            for kind, entries in (("RPATH", so.rpath), ("RUNPATH", so.runpath)):
                for entry in entries:
                    reason = unsafe_rpath_reason(entry, spec.build_dirs, so.member)
                    if reason:
                        findings.append(
                            Finding(ERROR, "rpath", name, so.member, f"{kind} {entry!r}: {reason}")
                        )
            if so.is_cuda:
                findings.extend(_arch_findings(name, so, spec.arches))
                if spec.cuobjdump:
                    so, extra = _with_cuobjdump(name, so, spooled, spec.cuobjdump)
                    findings.extend(extra)
            shared.append(so)
    if spec.require_cuda and spec.arches and not any(s.is_cuda for s in shared):
        elves = ", ".join(s.member for s in shared) or "no ELF members"
        findings.append(
            Finding(
                ERROR,
                "cuda",
                name,
                None,
                f"no CUDA shared object (no .nv_fatbin section) in the wheel; ELF members: {elves}",
            )
        )
    wheel_floor = abifloor.floor({s.member: s.needs for s in shared})
    findings.extend(_floor_findings(name, wheel_floor, spec.max_glibc, spec.glibc_limit))
    audit_out = None
    if spec.auditwheel:
        audit_out, problem_finding = _auditwheel(spec.auditwheel, path)
        if problem_finding:
            findings.append(problem_finding)
    digest = sha256_file(path)
    summary = WheelCheck(
        name, str(path), digest, len(members), tuple(shared), audit_out, wheel_floor
    )
    return summary, findings, members


def _floor_findings(
    wheel: str, floor: abifloor.Floor, max_glibc: abifloor.Version | None, limit: str
) -> list[Finding]:
    """An error when the wheel needs a newer glibc than ``max_glibc`` (``limit``) allows."""
    req = floor.get("GLIBC")
    if max_glibc is None or req is None or req.version <= max_glibc:
        return []
    symbol = f" (symbol {req.symbol})" if req.symbol else ""
    return [
        Finding(
            ERROR,
            "glibc",
            wheel,
            req.member,
            f"needs {req.name}{symbol} from {req.library}: above {limit} "
            f"{abifloor.show(max_glibc)}, so it fails to load there",
        )
    ]


def _looks_native(name: str) -> bool:
    base = PurePosixPath(name).name
    return base.endswith(".so") or ".so." in base or "/bin/" in f"/{name}" or "." not in base


def check_wheels(
    paths: Sequence[Path],
    spec: CheckSpec,
    *,
    alongside: Sequence[Path] = (),
    has_engine: bool | None = None,
) -> CheckReport:
    """Check ``paths``; ``alongside`` (wheels already checked, kept in the same set) only
    count toward ``required_members``.

    ``required_members`` are the engine's ([build] required_members): they apply to a
    set that contains the engine only. ``has_engine`` says whether it does; None: the
    ``provenance.json`` beside the wheels says, else a wheel holding a pattern's
    top-level package (``vllm/`` for ``vllm/_C.abi3.so``) is the engine.
    """
    if not paths:
        raise UsageError(
            "no wheels to check", next="pass WHEEL files: `pinwheel check wheels/*.whl`"
        )
    for p in paths:
        if not Path(p).is_file():
            raise UsageError(f"no such wheel: {p}", next="build first: `tools/replay build`")
    wheels: list[WheelCheck] = []
    findings: list[Finding] = []
    listing: list[tuple[str, list[str]]] = []
    for p in paths:
        summary, found, members = check_wheel(Path(p), spec)
        wheels.append(summary)
        findings.extend(found)
        listing.append((summary.wheel, members))
    for p in alongside:
        with zipfile.ZipFile(p) as zf:
            listing.append((Path(p).name, zf.namelist()))
    if has_engine is None:
        has_engine = _engine_in_set([Path(p) for p in (*paths, *alongside)], listing, spec)
    if has_engine:
        findings.extend(_required_findings(listing, spec.required_members))
    elif spec.required_members:
        findings.append(
            Finding(
                WARNING,
                "required",
                ", ".join(w for w, _ in listing),
                None,
                "no engine wheel in this set: the engine's required members "
                f"({', '.join(spec.required_members)}) are not checked",
            )
        )
    tools = tuple(
        (k, _tool_version(v))
        for k, v in (("cuobjdump", spec.cuobjdump), ("auditwheel", spec.auditwheel))
        if v
    )
    return CheckReport(spec.arches, tuple(wheels), tuple(findings), tools)


def spec_from_build(config: Any, **overrides: Any) -> CheckSpec:
    """A :class:`CheckSpec` from a :class:`pinwheel.manifest.build.BuildConfig`."""
    fields: dict[str, Any] = {
        "arches": config.targets,
        "required_members": tuple(config.required_members),
        "max_glibc": config.max_glibc,
    }
    fields.update(overrides)
    return CheckSpec(**fields)
